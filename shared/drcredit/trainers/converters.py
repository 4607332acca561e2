"""Agent trajectories into the API's rollout format (SPEC section 1).

Two input shapes are read:

* OpenAI-style chat messages (:func:`from_chat_messages`): ``assistant`` messages with
  ``tool_calls``, ``tool`` messages answering them by ``tool_call_id``.
* ReAct text (:func:`from_react_text`): reasoning (optionally in ``<think>``),
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  ``<tool_response>...</tool_response>`` and a final ``<answer>...</answer>``.

Turns: one turn per tool call, in call order. Calls named in :class:`ToolNames` become
``search`` / ``visit`` turns, any other call a ``tool`` turn; the final assistant output
without a tool call becomes the ``answer`` turn. Every turn of a message gets that
message's reasoning, because the visit judge reads the reasoning before each visit.
Result ids ``S1, S2, ...`` and page ids ``W1, W2, ...`` are numbered per rollout in turn
order (ids a tool printed itself are not kept, so ids are unique whatever the tool did).

Search tool responses accepted:

* JSON: a list of results, an object with ``"results"``, or a list of per-query objects
  each with ``"results"``. A result needs ``url`` (or ``link`` / ``href``); ``title`` (or
  ``name``) and ``snippet`` (or ``content`` / ``description`` / ``text``) are optional.
  ``{"error": "..."}`` sets the turn's ``error``.
* Plain text: numbered entries (``1. Title``, ``2) Title`` or ``[3] Title``; a heading
  ``1. [Title](https://...)`` carries its URL). Inside an entry, ``URL:`` / ``Link:`` or a
  bare URL line give the URL, ``Title:`` the title, ``Snippet:`` / ``Description:`` /
  ``Content:`` and any other line the snippet. Numbering may restart at 1 (one list per
  query); a Markdown heading or a ``===`` / ``---`` line ends an entry, and text before the
  first entry (``A search for 'x' found 10 results:``) is a preamble. Text with no entry
  is an empty result list when it says so (``No results found``), the turn's ``error``
  when it is a failure notice, and a :class:`ConversionError` otherwise.

Visit tool responses accepted:

* JSON: a list of pages, an object with ``"pages"``, or a single page object. A page has
  ``url`` (or ``link``; taken from the call by position when missing and the counts
  agree), ``evidence`` (or ``content``), ``summary`` and ``error``. ``{"error": "..."}``
  alone fails every called URL.
* ``<webpage url="..."><evidence>...</evidence><summary>...</summary></webpage>`` blocks
  (the paper's visit tool), with an optional ``<error>`` child or ``error`` attribute.
* Plain text in per-URL sections. A section starts with ``URL: <url>`` (or ``Page:`` /
  ``Webpage:``), a Markdown heading ending in the URL, or ``The useful information in
  <url> ...``. Inside a section ``Evidence:`` (or ``Evidence in page:``), ``Summary:`` and
  ``Error:`` start fields that run to the next key; ``Goal:`` / ``Title:`` lines are
  skipped; without an ``Evidence:`` key the section's text is the evidence. Text before
  the first section (``Visited 2 pages:``) is a preamble. A response with no section
  header is one section for the single called URL (or, if it is a failure notice, the
  failure of every called URL).

A page fails (``error`` set, ``evidence`` empty) on an explicit error, or when its
evidence is only a short failure notice: ``Failed to fetch``, ``HTTP 404``, ``403
Forbidden``, ``timed out``, ``could not be accessed``, ... A called URL that no section
answers, in a response with fewer pages than URLs, gets a page failed with ``no response
for this URL``.

A call with no response is allowed only in the last step of a truncated rollout: its
search turn has no results and ``error`` ``no response``, its visit turn one page per
called URL with ``error`` ``no response``. Anything else that cannot be read raises
:class:`ConversionError` naming where; no turn is ever dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from drcredit.domain.errors import errors_from_pydantic
from drcredit.domain.group import GroupIn, Rollout
from drcredit.domain.urls import norm_url

NO_RESPONSE = "no response"
MISSING_PAGE = "no response for this URL"


class ConversionError(ValueError):
    """A trajectory that cannot be converted, with where (``messages[3]``, ``block 5 ...``)."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class ToolNames:
    """Which tool names are searches and visits, and which argument keys hold what.

    Each ``*_keys`` field lists candidate keys; the first present in the arguments wins.
    A bare string where a tuple is expected is taken as a one-name tuple (not its characters).
    """

    search: tuple[str, ...] = ("web_search", "search")
    visit: tuple[str, ...] = ("web_visit", "visit")
    query_keys: tuple[str, ...] = ("queries", "query")
    url_keys: tuple[str, ...] = ("urls", "url")
    goal_keys: tuple[str, ...] = ("goal",)

    def __post_init__(self) -> None:
        for name in ("search", "visit", "query_keys", "url_keys", "goal_keys"):
            value: Any = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, (value,))
        overlap = set(self.search) & set(self.visit)
        if overlap:
            raise ValueError(f"tool names both search and visit: {sorted(overlap)}")


# ----------------------------------------------------------------------------- public entry points


def from_chat_messages(
    messages: Sequence[Mapping[str, Any]],
    *,
    rollout_id: str,
    outcome_reward: float | None = None,
    tools: ToolNames = ToolNames(),
) -> dict[str, Any]:
    """Convert OpenAI-style chat messages into a rollout dict that validates as ``Rollout``.

    ``system`` / ``user`` / ``developer`` messages are context, not turns. An assistant
    message that is neither the last one nor makes a tool call adds its text to the next
    turn's reasoning. The last assistant message, when it makes no tool call, is the
    answer (the inside of its ``<answer>`` block when it has one).
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ConversionError("messages", f"expected a list of messages, got {type(messages).__name__}")
    last_assistant = max((i for i, m in enumerate(messages) if _role(m) == "assistant"), default=-1)
    if last_assistant < 0:
        raise ConversionError("messages", "no assistant message: there is nothing to convert")
    steps: list[_Step] = []
    pending: dict[int, _Step] = {}  # position in steps -> step, unanswered
    by_id: dict[str, int] = {}
    answered_ids: set[str] = set()
    carry: list[str] = []
    answer: dict[str, Any] | None = None
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise ConversionError(where, f"expected a message object, got {type(message).__name__}")
        role = message.get("role")
        if role in ("system", "user", "developer"):
            continue
        if role == "assistant":
            _no_unanswered(pending, f"before the next assistant message ({where})")
            by_id.clear()
            calls = message.get("tool_calls") or []
            if message.get("function_call") and not calls:
                raise ConversionError(where, "legacy 'function_call' is not supported; use 'tool_calls'")
            if not isinstance(calls, list):
                raise ConversionError(f"{where}.tool_calls", "expected a list")
            thinking, text = _split_think(_text(message.get("content"), f"{where}.content"))
            extra = message.get("reasoning_content") or message.get("reasoning") or ""
            if not isinstance(extra, str):
                raise ConversionError(f"{where}.reasoning_content", "expected a string")
            if calls:
                reasoning = _join(*carry, extra, thinking, text)
                carry.clear()
                for k, raw in enumerate(calls):
                    step = _Step(_chat_call(raw, f"{where}.tool_calls[{k}]"), reasoning)
                    pending[len(steps)] = step
                    if step.call.call_id is not None:
                        if step.call.call_id in by_id:
                            raise ConversionError(step.call.where, f"duplicate tool call id {step.call.call_id!r}")
                        by_id[step.call.call_id] = len(steps)
                    steps.append(step)
            elif "<tool_call>" in text:
                raise ConversionError(
                    where, "a <tool_call> block in the text of a chat message; read such logs with from_react_text"
                )
            elif i == last_assistant:
                answer = _answer_turn(_join(*carry, extra, thinking), text)
                carry.clear()
            else:
                carry.append(_join(extra, thinking, text))
        elif role == "tool":
            content = _tool_content(message.get("content"), f"{where}.content")
            call_id = message.get("tool_call_id")
            if call_id is not None and not isinstance(call_id, str):
                raise ConversionError(f"{where}.tool_call_id", "expected a string")
            if call_id is not None:
                if call_id in by_id and by_id[call_id] in pending:
                    position = by_id[call_id]
                elif call_id in answered_ids:
                    raise ConversionError(where, f"a second response to tool call {call_id!r}")
                else:
                    raise ConversionError(
                        where, f"tool response for {call_id!r}, which no unanswered tool call of this step has"
                    )
            elif pending:
                position = min(pending)
            else:
                raise ConversionError(where, "tool response with no matching tool call")
            step = pending.pop(position)
            step.response = _Response(content, where)
            if step.call.call_id is not None:
                answered_ids.add(step.call.call_id)
        else:
            raise ConversionError(where, f"unknown message role {role!r}")
    turns = _build_turns(steps, tools)
    if answer is not None:
        turns.append(answer)
    return _validated_rollout(rollout_id, outcome_reward, turns)


def from_react_text(
    text: str,
    *,
    rollout_id: str,
    outcome_reward: float | None = None,
    tools: ToolNames = ToolNames(),
) -> dict[str, Any]:
    """Convert one ReAct transcript (the response part, after the prompt) into a rollout dict.

    Chat-template markers (``<|im_start|>assistant``, ``<|im_end|>``) are ignored. Calls
    made together are answered by the following responses in order. The final text after
    the last response, with or without an ``<answer>`` block, is the answer turn; a
    transcript that ends on a tool response (turn limit) has none.
    """
    if not isinstance(text, str):
        raise ConversionError("text", f"expected a string, got {type(text).__name__}")
    text = _TEMPLATE_MARKER.sub(lambda m: " " * len(m.group(0)), text)  # keep offsets
    steps: list[_Step] = []
    pending: list[_Step] = []
    outside: list[str] = []
    answer_parts: tuple[str, str] | None = None
    after_answer: list[str] = []
    last_tag = ""
    block = 0
    pos = 0
    while True:
        match = _REACT_OPEN.search(text, pos)
        chunk = text[pos : match.start() if match else len(text)]
        stray = _REACT_CLOSE.search(chunk)
        if stray:
            raise ConversionError(f"offset {pos + stray.start()}", f"{stray.group(0)} without its opening tag")
        (after_answer if answer_parts is not None else outside).append(chunk)
        if match is None:
            break
        block += 1
        tag = match.group(1)
        where = f"block {block} (<{tag}> at offset {match.start()})"
        end = text.find(f"</{tag}>", match.end())
        if end < 0 and tag != "answer":
            raise ConversionError(where, f"<{tag}> is never closed")
        inner = text[match.end() : end if end >= 0 else len(text)]
        pos = end + len(tag) + 3 if end >= 0 else len(text)
        if answer_parts is not None:
            raise ConversionError(where, f"<{tag}> after the final <answer>")
        if tag == "tool_call":
            if pending and last_tag == "tool_response":
                _no_unanswered(dict(enumerate(pending)), f"before the next tool call ({where})")
            steps.append(_Step(_react_call(inner, where), _join(*_split_think("".join(outside)))))
            pending.append(steps[-1])
            outside.clear()
        elif tag == "tool_response":
            if not pending:
                raise ConversionError(where, "tool response with no matching tool call")
            pending.pop(0).response = _Response(inner.strip(), where)
        else:
            _no_unanswered(dict(enumerate(pending)), f"before the final answer ({where})")
            answer_parts = (_join(*_split_think("".join(outside))), inner)
            outside.clear()
        last_tag = tag
    turns = _build_turns(steps, tools)
    if answer_parts is not None:
        reasoning, inner = answer_parts
        turns.append(_answer_turn(_join(reasoning, *_split_think("".join(after_answer))), f"<answer>{inner}"))
    elif "".join(outside).strip():
        if pending:
            offset = len(text) - len("".join(outside))
            raise ConversionError(f"offset {offset}", "text after a tool call that has no response")
        thinking, final = _split_think("".join(outside))
        turns.append(_answer_turn(thinking, final))
    return _validated_rollout(rollout_id, outcome_reward, turns)


def group_from_rollouts(
    question: str,
    rubrics: Iterable[Mapping[str, Any] | BaseModel],
    rollouts: Iterable[Mapping[str, Any] | BaseModel],
    *,
    group_id: str | None = None,
    params: Mapping[str, Any] | BaseModel | None = None,
    metadata: Any = None,
) -> dict[str, Any]:
    """A full ``POST /v1/groups`` body, checked with ``GroupIn`` so mistakes show before posting."""
    doc: dict[str, Any] = {
        "question": question,
        "rubrics": [_plain(r) for r in rubrics],
        "rollouts": [_plain(r) for r in rollouts],
    }
    if group_id is not None:
        doc["group_id"] = group_id
    if params is not None:
        doc["params"] = _plain(params)
    if metadata is not None:
        doc["metadata"] = metadata
    try:
        GroupIn.model_validate(doc)
    except ValidationError as exc:
        raise ConversionError("group", _describe(exc)) from None
    return doc


# ----------------------------------------------------------------------------- calls and steps


@dataclass
class _Call:
    where: str
    name: str
    arguments: dict[str, Any]
    call_id: str | None = None


@dataclass
class _Response:
    content: Any
    where: str


@dataclass
class _Step:
    call: _Call
    reasoning: str
    response: _Response | None = None


@dataclass
class _Ids:
    results: int = 0
    pages: int = 0

    def result(self) -> str:
        self.results += 1
        return f"S{self.results}"

    def page(self) -> str:
        self.pages += 1
        return f"W{self.pages}"


def _no_unanswered(pending: Mapping[int, _Step], when: str) -> None:
    if pending:
        step = pending[min(pending)]
        raise ConversionError(step.call.where, f"tool call {step.call.name!r} has no response {when}")


def _chat_call(raw: Any, where: str) -> _Call:
    if not isinstance(raw, Mapping):
        raise ConversionError(where, f"expected a tool call object, got {type(raw).__name__}")
    kind = raw.get("type", "function")
    if kind != "function":
        raise ConversionError(f"{where}.type", f"unsupported tool call type {kind!r}")
    function = raw.get("function")
    if not isinstance(function, Mapping):
        raise ConversionError(f"{where}.function", "missing")
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConversionError(f"{where}.function.name", "missing or empty")
    call_id = raw.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise ConversionError(f"{where}.id", "expected a string")
    return _Call(where, name, _arguments(function.get("arguments"), f"{where}.function.arguments", name), call_id)


def _react_call(inner: str, where: str) -> _Call:
    try:
        body = json.loads(inner)
    except json.JSONDecodeError as exc:
        raise ConversionError(where, f"tool call is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(body, dict):
        raise ConversionError(where, f"tool call must be a JSON object, got {type(body).__name__}")
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConversionError(where, "tool call has no 'name'")
    raw = body.get("arguments", body.get("parameters"))
    return _Call(where, name, _arguments(raw, where, name))


def _arguments(raw: Any, where: str, name: str) -> dict[str, Any]:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConversionError(
                where, f"arguments of {name!r} are not valid JSON: {exc.msg} at position {exc.pos}"
            ) from None
    if not isinstance(raw, Mapping):
        raise ConversionError(where, f"arguments of {name!r} must be a JSON object, got {type(raw).__name__}")
    return dict(raw)


def _build_turns(steps: list[_Step], tools: ToolNames) -> list[dict[str, Any]]:
    """Turns in call order; ids are given here so that they follow turn order."""
    ids = _Ids()
    turns = []
    for step in steps:
        call, response = step.call, step.response
        if call.name in tools.search:
            queries = _strings(call.arguments, tools.query_keys, call.where)
            if response is None:
                results: list[dict[str, Any]] = []
                error: str | None = NO_RESPONSE
            else:
                results, error = _search_results(response.content, ids, response.where)
            turns.append(
                {
                    "type": "search",
                    "reasoning": step.reasoning,
                    "call": {"queries": queries},
                    "results": results,
                    "error": error,
                }
            )
        elif call.name in tools.visit:
            urls = _strings(call.arguments, tools.url_keys, call.where)
            goal = _first(call.arguments, tools.goal_keys)
            if response is None:
                pages = [_page(ids, url, error=NO_RESPONSE) for url in (urls or [""])]
            else:
                pages = _visit_pages(response.content, urls, ids, response.where)
            visit_call: dict[str, Any] = {"urls": urls, "goal": _str(goal)}
            turns.append(
                {
                    "type": "visit",
                    "reasoning": step.reasoning,
                    "call": visit_call,
                    "pages": pages,
                }
            )
        else:
            turns.append(
                {
                    "type": "tool",
                    "reasoning": step.reasoning,
                    "name": call.name,
                    "arguments": call.arguments,
                    "response": None if response is None else response.content,
                }
            )
    return turns


def _first(arguments: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for key in keys:
        if key in arguments:
            return arguments[key]
    return None


def _strings(arguments: Mapping[str, Any], keys: Sequence[str], where: str) -> list[str]:
    value = _first(arguments, keys)
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, (dict, list)):
            raise ConversionError(where, f"argument {keys[0]!r} must hold strings, got {item!r}")
        out.append(str(item))
    return out


# ----------------------------------------------------------------------------- text helpers

_TEMPLATE_MARKER = re.compile(r"<\|im_start\|>[a-z]*|<\|im_end\|>|<\|endoftext\|>")
_REACT_OPEN = re.compile(r"<(tool_call|tool_response|answer)>")
_REACT_CLOSE = re.compile(r"</(?:tool_call|tool_response|answer)>")
_THINK = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.S)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.S)


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, Mapping) else None


def _text(content: Any, where: str) -> str:
    """Chat content as text: a string, ``None`` or a list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise ConversionError(f"{where}[{k}]", "only text content parts are supported")
        return "".join(parts)
    raise ConversionError(where, f"expected text content, got {type(content).__name__}")


def _tool_content(content: Any, where: str) -> Any:
    """Tool output: text, or JSON a log already parsed (kept as is).

    A list whose items all have a ``type`` is content parts; any other list is JSON.
    """
    if isinstance(content, Mapping):
        return dict(content)
    if isinstance(content, list) and not (content and all(isinstance(p, Mapping) and "type" in p for p in content)):
        return content  # parsed JSON, not content parts
    return _text(content, where)


def _split_think(text: str) -> tuple[str, str]:
    """``(thinking, rest)``; a ``</think>`` with no opening tag closes a prompt-opened block."""
    close = text.find("</think>")
    if close >= 0 and "<think>" not in text[:close]:
        head, text = text[:close], text[close + len("</think>") :]
        thinking = [head]
    else:
        thinking = []
    thinking += _THINK.findall(text)
    rest = _THINK.sub("", text)
    return _join(*thinking), rest.strip()


def _join(*parts: str | tuple[str, str]) -> str:
    flat: list[str] = []
    for part in parts:
        flat.extend(part if isinstance(part, tuple) else (part,))
    return "\n\n".join(p.strip() for p in flat if p and p.strip())


def _answer_turn(reasoning: str, text: str) -> dict[str, Any]:
    """The answer is the inside of the ``<answer>`` blocks (or the whole text without one).

    Several blocks are joined rather than one picked, so no report text is lost; an
    unclosed block (generation cut) runs to the end. Text outside the blocks is reasoning.
    """
    thinking, text = _split_think(text)
    blocks = _ANSWER.findall(text)
    if blocks:
        outside = _ANSWER.sub("", text)
        answer = "\n\n".join(b.strip() for b in blocks)
    else:
        outside, answer = "", text.strip()
    return {"type": "answer", "reasoning": _join(reasoning, thinking, outside), "answer": answer}


# ----------------------------------------------------------------------------- failures

_FAILURE_NOTICE = re.compile(
    r"^\W*(?:error|failed|failure|timeout|timed out)\b\s*[:\-!(]"
    r"|^\W*(?:timeout|timed out)\b"
    r"|\bfailed to (?:fetch|load|retrieve|access|visit|open|read|crawl|get)\b"
    r"|\bcould not be (?:accessed|fetched|retrieved|loaded|reached|processed|opened)\b"
    r"|\b(?:unable to|could not|couldn't|cannot) (?:fetch|access|retrieve|load|reach|open|visit)\b"
    r"|\bhttp(?: error| status(?: code)?)?\s*:?\s*[45]\d\d\b"
    r"|\bstatus(?: code)?\s*:?\s*[45]\d\d\b"
    r"|\b[45]\d\d\s*(?:client error|server error|not found|forbidden|unauthorized|gone|too many requests"
    r"|internal server error|bad gateway|service unavailable|gateway time-?out)\b"
    r"|\b(?:request|connection|read|page load|navigation)\s+(?:timed out|timeout)\b",
    re.I,
)
_NO_RESULTS = re.compile(
    r"\bno (?:relevant |search |web )?results\b|\b(?:found|returned) 0 results\b|\bnothing found\b", re.I
)
_NOTICE_LIMIT = 300


def _failure(text: str | None) -> str | None:
    """The text itself when it is only a short failure notice, else None."""
    if not text:
        return None
    stripped = text.strip()
    if len(stripped) <= _NOTICE_LIMIT and _FAILURE_NOTICE.search(stripped):
        return stripped
    return None


# ----------------------------------------------------------------------------- search responses

_ENTRY = re.compile(r"^\s*(?:(\d+)[.)]|\[(\d+)\])\s+(.*)$")
_MD_LINK = re.compile(r"^\[(?P<title>[^\]]*)\]\((?P<url>[^)\s]+)\)\s*(?P<rest>.*)$")
_URL_LINE = re.compile(r"^\s*<?(https?://[^\s>]+)>?\s*$")
_RESULT_KEY = re.compile(r"^\s*(title|url|link|source url|snippet|description|content)\s*:\s*(.*)$", re.I)
_BREAK = re.compile(r"^\s*(?:#{1,6}\s|={3,}\s*$|-{3,}\s*$|\*{3,}\s*$|_{3,}\s*$)")


def _search_results(content: Any, ids: _Ids, where: str) -> tuple[list[dict[str, Any]], str | None]:
    parsed = _maybe_json(content)
    if parsed is not None:
        return _json_results(parsed, ids, where)
    text = str(content).strip()
    entries = _text_entries(text, where)
    if not entries:
        if not text or _NO_RESULTS.search(text):
            return [], None
        notice = _failure(text)
        if notice:
            return [], notice
        raise ConversionError(where, f"search response is neither JSON nor numbered text entries: {_preview(text)!r}")
    return [dict(e, id=ids.result()) for e in entries], None


def _maybe_json(content: Any) -> Any:
    """Parsed JSON (a dict or list), or None for text that is not JSON."""
    if isinstance(content, (dict, list)):
        return content
    if isinstance(content, str) and content.strip()[:1] in ("[", "{"):
        try:
            value = json.loads(content)
        except json.JSONDecodeError:
            return None  # e.g. "[1] Title" or "[Title](url)": plain text
        return value if isinstance(value, (dict, list)) else None
    return None


def _json_results(value: Any, ids: _Ids, where: str) -> tuple[list[dict[str, Any]], str | None]:
    if isinstance(value, dict):
        if "results" in value:
            items = value["results"]
        elif value.get("error"):
            return [], str(value["error"])
        elif _first(value, ("url", "link", "href")) is not None:
            items = [value]
        else:
            raise ConversionError(where, f"JSON search response has no 'results' list (keys: {sorted(value)})")
    else:
        items = value
    if not isinstance(items, list):
        raise ConversionError(where, "'results' of the JSON search response must be a list")
    flat: list[Any] = []
    for item in items:
        if isinstance(item, Mapping) and isinstance(item.get("results"), list):
            flat.extend(item["results"])  # one object per query
        else:
            flat.append(item)
    results = []
    for j, item in enumerate(flat):
        if not isinstance(item, Mapping):
            raise ConversionError(where, f"search result {j} is not an object: {_preview(repr(item))}")
        url = _first(item, ("url", "link", "href"))
        if not isinstance(url, str) or not url.strip():
            raise ConversionError(where, f"search result {j} has no url")
        results.append(
            {
                "id": ids.result(),
                "url": url.strip(),
                "title": _str(_first(item, ("title", "name"))),
                "snippet": _str(_first(item, ("snippet", "content", "description", "text"))),
            }
        )
    return results, None


def _text_entries(text: str, where: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    last_number = 0
    for line in text.splitlines():
        if _BREAK.match(line):
            current = None
            continue
        entry = _ENTRY.match(line)
        number = int(entry.group(1) or entry.group(2)) if entry else 0
        if entry and (number == 1 or number == last_number + 1):
            last_number = number
            current = {"number": number, "url": "", "title": "", "snippet": []}
            entries.append(current)
            head = entry.group(3).strip()
            link = _MD_LINK.match(head)
            bare = _URL_LINE.match(head)
            if link:
                current["title"], current["url"] = link["title"].strip(), link["url"]
                if link["rest"].strip():
                    current["snippet"].append(link["rest"].strip())
            elif bare:
                current["url"] = bare.group(1)
            else:
                current["title"] = head
            continue
        if current is None or not line.strip():
            continue
        key = _RESULT_KEY.match(line)
        bare = _URL_LINE.match(line)
        if key and key.group(1).lower() == "title" and not current["title"]:
            current["title"] = key.group(2).strip()
        elif key and key.group(1).lower() in ("url", "link", "source url") and not current["url"]:
            current["url"] = key.group(2).strip().strip("<>")
        elif key and key.group(1).lower() in ("snippet", "description", "content"):
            current["snippet"].append(key.group(2).strip())
        elif bare and not current["url"]:
            current["url"] = bare.group(1)
        else:
            current["snippet"].append(line.strip())
    out = []
    for e in entries:
        if not e["url"]:
            raise ConversionError(where, f"search entry {e['number']} ({_preview(e['title'])!r}) has no URL")
        out.append({"url": e["url"], "title": e["title"], "snippet": "\n".join(s for s in e["snippet"] if s)})
    return out


# ----------------------------------------------------------------------------- visit responses

_SECTION = re.compile(
    r"^\s*(?:(?:url|page|webpage)\s*:\s*<?(?P<u1>https?://[^\s>]+)>?\s*$"
    r"|#{1,6}\s.*?<?(?P<u2>https?://[^\s>]+)>?\s*$"
    r"|the useful information in\s+<?(?P<u3>https?://[^\s>]+?)>?\s)",
    re.I,
)
_PAGE_KEY = re.compile(r"^\s*(evidence(?: in page)?|summary|error|goal|title)\s*:\s*(.*)$", re.I)
_SEPARATOR = re.compile(r"^\s*(?:={3,}|-{3,})\s*$")
_WEBPAGE = re.compile(r"<webpage\b([^>]*?)(?:/>|>(.*?)</webpage>)", re.S)
_ATTR = re.compile(r"([\w-]+)\s*=\s*\"([^\"]*)\"")


def _visit_pages(content: Any, urls: list[str], ids: _Ids, where: str) -> list[dict[str, Any]]:
    parsed = _maybe_json(content)
    if parsed is not None:
        raw = _json_pages(parsed, urls, where)
    elif "<webpage" in str(content):
        raw = _xml_pages(str(content), urls, where)
    else:
        raw = _text_pages(str(content), urls, where)
    if len(raw) < len(urls):
        covered = {norm_url(p["url"]) for p in raw}
        raw += [
            {"url": u, "evidence": None, "summary": None, "error": MISSING_PAGE}
            for u in urls
            if norm_url(u) not in covered
        ]
    return [_page(ids, p["url"], p["evidence"], p["summary"], p["error"]) for p in raw]


def _page(
    ids: _Ids, url: str, evidence: str | None = None, summary: str | None = None, error: str | None = None
) -> dict[str, Any]:
    """A page; a failed page keeps its error and has empty evidence, so it is never usable."""
    evidence = evidence.strip() if isinstance(evidence, str) else evidence
    summary = summary.strip() if isinstance(summary, str) else summary
    error = error.strip() if isinstance(error, str) and error.strip() else None
    if error is None:
        error = _failure(evidence)
    if error is not None:
        evidence = ""
    return {"id": ids.page(), "url": url, "evidence": evidence, "summary": summary, "error": error}


def _everywhere(urls: list[str], error: str) -> list[dict[str, Any]]:
    return [{"url": u, "evidence": None, "summary": None, "error": error} for u in (urls or [""])]


def _json_pages(value: Any, urls: list[str], where: str) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        if "pages" in value:
            items = value["pages"]
        elif value.get("error") and not any(k in value for k in ("evidence", "content", "summary", "url")):
            return _everywhere(urls, str(value["error"]))
        else:
            items = [value]
    else:
        items = value
    if not isinstance(items, list):
        raise ConversionError(where, "'pages' of the JSON visit response must be a list")
    pages = []
    for j, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ConversionError(where, f"page {j} is not an object: {_preview(repr(item))}")
        url = _first(item, ("url", "link"))
        if url is None:
            if len(items) != len(urls):
                raise ConversionError(
                    where, f"page {j} has no url and the call has {len(urls)} URLs for {len(items)} pages"
                )
            url = urls[j]
        error = item.get("error")
        pages.append(
            {
                "url": _str(url),
                "evidence": _opt_str(_first(item, ("evidence", "content"))),
                "summary": _opt_str(item.get("summary")),
                "error": None if error in (None, False, "") else str(error),
            }
        )
    return pages


def _xml_pages(text: str, urls: list[str], where: str) -> list[dict[str, Any]]:
    blocks = list(_WEBPAGE.finditer(text))
    if not blocks:
        raise ConversionError(where, "a <webpage> block is never closed")
    pages = []
    for j, block in enumerate(blocks):
        attrs = dict(_ATTR.findall(block.group(1)))
        body = block.group(2) or ""
        url = attrs.get("url")
        if url is None:
            if len(blocks) != len(urls):
                raise ConversionError(
                    where, f"<webpage> {j} has no url and the call has {len(urls)} URLs for {len(blocks)} pages"
                )
            url = urls[j]
        child = {tag: _inner(body, tag) for tag in ("evidence", "summary", "error")}
        status = attrs.get("status", "")
        error = child["error"] or attrs.get("error") or (status if status.lower() in ("error", "failed") else None)
        pages.append({"url": url, "evidence": child["evidence"], "summary": child["summary"], "error": error})
    return pages


def _inner(body: str, tag: str) -> str | None:
    match = re.search(rf"<{tag}\b[^>]*>(.*?)</{tag}>", body, re.S)
    return match.group(1) if match else None


def _text_pages(text: str, urls: list[str], where: str) -> list[dict[str, Any]]:
    sections: list[tuple[str | None, list[str]]] = []
    preamble: list[str] = []
    for line in text.splitlines():
        header = _SECTION.match(line)
        if header:
            url = header.group("u1") or header.group("u2") or header.group("u3")
            sections.append((url, []))
        elif _SEPARATOR.match(line):
            continue
        elif sections:
            sections[-1][1].append(line)
        else:
            preamble.append(line)
    if not sections:
        fields = _page_fields(preamble)
        notice = None if "evidence" in fields else fields.get("error") or _failure(fields.get("body"))
        if notice:
            return _everywhere(urls, notice)
        if len(urls) > 1:
            raise ConversionError(
                where, f"visit response for {len(urls)} URLs has no per-URL sections: {_preview(text.strip())!r}"
            )
        return [_text_page(urls[0] if urls else "", preamble)]
    return [_text_page(url or "", lines) for url, lines in sections]  # a preamble is tool chatter


def _page_fields(lines: list[str]) -> dict[str, str]:
    """Split a section into its keyed fields; text before any key is ``body``.

    Once inside the evidence or the summary, only the other of the two starts a new
    field, so page text with a line like ``Error: ...`` or ``Title: ...`` stays evidence.
    """
    fields: dict[str, list[str]] = {}
    key = "body"
    for line in lines:
        match = _PAGE_KEY.match(line)
        new = match.group(1).lower().split()[0] if match else None
        if match and new and (key not in ("evidence", "summary") or new in ("evidence", "summary")):
            key = new
            fields.setdefault(key, []).append(match.group(2))
        else:
            fields.setdefault(key, []).append(line)
    return {k: "\n".join(v).strip() for k, v in fields.items()}


def _text_page(url: str, lines: list[str]) -> dict[str, Any]:
    fields = _page_fields(lines)
    evidence = fields.get("evidence", fields.get("body"))
    return {
        "url": url,
        "evidence": evidence,
        "summary": fields.get("summary"),
        "error": fields.get("error") or None,
    }


# ----------------------------------------------------------------------------- output


def _str(value: Any) -> str:
    return "" if value is None else str(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _preview(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plain(value: Mapping[str, Any] | BaseModel) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return dict(value)


def _describe(exc: ValidationError) -> str:
    return "; ".join(str(e) for e in errors_from_pydantic(exc.errors()))


def _validated_rollout(rollout_id: str, outcome_reward: float | None, turns: list[dict[str, Any]]) -> dict[str, Any]:
    """The rollout dict, checked against the service's own model before it leaves."""
    doc: dict[str, Any] = {"id": rollout_id, "turns": turns}
    if outcome_reward is not None:
        doc["outcome_reward"] = outcome_reward
    try:
        Rollout.model_validate(doc)
    except ValidationError as exc:
        raise ConversionError(f"rollout {rollout_id!r}", _describe(exc)) from None
    return doc
