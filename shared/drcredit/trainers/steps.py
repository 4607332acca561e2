"""Tool calls paired with their responses, and the turns they become.

A step is one tool call with the reasoning before it and the response that answered it;
:func:`build_turns` makes one API turn per step, reading each response with
:mod:`drcredit.trainers.tool_responses`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from drcredit.trainers.tool_ids import assign_ids
from drcredit.trainers.tool_responses import NO_RESPONSE, ConversionError, as_str, first_arg, search_results
from drcredit.trainers.visit_responses import page_entry, visit_pages

# ----------------------------------------------------------------------------- calls and steps


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


@dataclass
class _Call:
    where: str
    name: str
    arguments: dict[str, Any]
    call_id: str | None = None


@dataclass
class Response:
    content: Any
    where: str


@dataclass
class Step:
    call: _Call
    reasoning: str
    response: Response | None = None


def no_unanswered(pending: Mapping[int, Step], when: str) -> None:
    if pending:
        step = pending[min(pending)]
        raise ConversionError(step.call.where, f"tool call {step.call.name!r} has no response {when}")


def chat_call(raw: Any, where: str) -> _Call:
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


def react_call(inner: str, where: str) -> _Call:
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


def build_turns(steps: list[Step], tools: ToolNames) -> list[dict[str, Any]]:
    """Turns in call order, with the ids the tools printed, made unique (:func:`assign_ids`)."""
    turns: list[dict[str, Any]] = []
    for step in steps:
        call, response = step.call, step.response
        if call.name in tools.search:
            queries = _strings(call.arguments, tools.query_keys, call.where)
            if response is None:
                results: list[dict[str, Any]] = []
                error: str | None = NO_RESPONSE
            else:
                results, error = search_results(response.content, response.where)
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
            goal = first_arg(call.arguments, tools.goal_keys)
            if response is None:
                pages = [page_entry(url, error=NO_RESPONSE) for url in (urls or [""])]
            else:
                pages = visit_pages(response.content, urls, response.where)
            visit_call: dict[str, Any] = {"urls": urls, "goal": as_str(goal)}
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
    assign_ids(turns)
    return turns


def _strings(arguments: Mapping[str, Any], keys: Sequence[str], where: str) -> list[str]:
    value = first_arg(arguments, keys)
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

TEMPLATE_MARKER = re.compile(r"<\|im_start\|>[a-z]*|<\|im_end\|>|<\|endoftext\|>")
REACT_OPEN = re.compile(r"<(tool_call|tool_response|answer)>")
REACT_CLOSE = re.compile(r"</(?:tool_call|tool_response|answer)>")
_THINK = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.S)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.S)


def message_role(message: Any) -> Any:
    return message.get("role") if isinstance(message, Mapping) else None


def message_text(content: Any, where: str) -> str:
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


def tool_content(content: Any, where: str) -> Any:
    """Tool output: text, or JSON a log already parsed (kept as is).

    A list whose items all have a ``type`` is content parts; any other list is JSON.
    """
    if isinstance(content, Mapping):
        return dict(content)
    if isinstance(content, list) and not (content and all(isinstance(p, Mapping) and "type" in p for p in content)):
        return content  # parsed JSON, not content parts
    return message_text(content, where)


def split_think(text: str) -> tuple[str, str]:
    """``(thinking, rest)``; a ``</think>`` with no opening tag closes a prompt-opened block."""
    close = text.find("</think>")
    if close >= 0 and "<think>" not in text[:close]:
        head, text = text[:close], text[close + len("</think>") :]
        thinking = [head]
    else:
        thinking = []
    thinking += _THINK.findall(text)
    rest = _THINK.sub("", text)
    return join_text(*thinking), rest.strip()


def join_text(*parts: str | tuple[str, str]) -> str:
    flat: list[str] = []
    for part in parts:
        flat.extend(part if isinstance(part, tuple) else (part,))
    return "\n\n".join(p.strip() for p in flat if p and p.strip())


def answer_turn(reasoning: str, text: str) -> dict[str, Any]:
    """The answer is the inside of the ``<answer>`` blocks (or the whole text without one).

    Several blocks are joined rather than one picked, so no report text is lost; an
    unclosed block (generation cut) runs to the end. Text outside the blocks is reasoning.
    """
    thinking, text = split_think(text)
    blocks = _ANSWER.findall(text)
    if blocks:
        outside = _ANSWER.sub("", text)
        answer = "\n\n".join(b.strip() for b in blocks)
    else:
        outside, answer = "", text.strip()
    return {"type": "answer", "reasoning": join_text(reasoning, thinking, outside), "answer": answer}
