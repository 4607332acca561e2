"""Agent trajectories into the API's rollout format (docs/method.md, "Input").

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
Result and page ids are the ones the tools printed (a report cites pages by them); an entry
printed without an id gets the first free ``S<n>`` / ``W<n>``, and an id printed twice is
kept by its latest usable page, the other occurrences renamed
(:mod:`drcredit.trainers.tool_ids`), so ids are unique and a report's citations still name
the page the agent last saw under them.

A call with no response is allowed only in the last step of a truncated rollout: its
search turn has no results and ``error`` ``no response``, its visit turn one page per
called URL with ``error`` ``no response``. Anything else that cannot be read raises
:class:`ConversionError` naming where; no turn is ever dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from drcredit.domain.errors import errors_from_pydantic
from drcredit.domain.group import GroupIn, Rollout
from drcredit.trainers.steps import (
    REACT_CLOSE,
    REACT_OPEN,
    TEMPLATE_MARKER,
    Response,
    Step,
    ToolNames,
    answer_turn,
    build_turns,
    chat_call,
    join_text,
    message_role,
    message_text,
    no_unanswered,
    react_call,
    split_think,
    tool_content,
)
from drcredit.trainers.tool_responses import ConversionError

# ----------------------------------------------------------------------------- public entry points

__all__ = [
    "ConversionError",
    "ToolNames",
    "from_chat_messages",
    "from_react_text",
    "group_from_rollouts",
]


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
    last_assistant = max((i for i, m in enumerate(messages) if message_role(m) == "assistant"), default=-1)
    if last_assistant < 0:
        raise ConversionError("messages", "no assistant message: there is nothing to convert")
    steps: list[Step] = []
    pending: dict[int, Step] = {}  # position in steps -> step, unanswered
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
            no_unanswered(pending, f"before the next assistant message ({where})")
            by_id.clear()
            calls = message.get("tool_calls") or []
            if message.get("function_call") and not calls:
                raise ConversionError(where, "legacy 'function_call' is not supported; use 'tool_calls'")
            if not isinstance(calls, list):
                raise ConversionError(f"{where}.tool_calls", "expected a list")
            thinking, text = split_think(message_text(message.get("content"), f"{where}.content"))
            extra = message.get("reasoning_content") or message.get("reasoning") or ""
            if not isinstance(extra, str):
                raise ConversionError(f"{where}.reasoning_content", "expected a string")
            if calls:
                reasoning = join_text(*carry, extra, thinking, text)
                carry.clear()
                for k, raw in enumerate(calls):
                    step = Step(chat_call(raw, f"{where}.tool_calls[{k}]"), reasoning)
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
                answer = answer_turn(join_text(*carry, extra, thinking), text)
                carry.clear()
            else:
                carry.append(join_text(extra, thinking, text))
        elif role == "tool":
            content = tool_content(message.get("content"), f"{where}.content")
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
            step.response = Response(content, where)
            if step.call.call_id is not None:
                answered_ids.add(step.call.call_id)
        else:
            raise ConversionError(where, f"unknown message role {role!r}")
    turns = build_turns(steps, tools)
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
    text = TEMPLATE_MARKER.sub(lambda m: " " * len(m.group(0)), text)  # keep offsets
    steps: list[Step] = []
    pending: list[Step] = []
    outside: list[str] = []
    answer_parts: tuple[str, str] | None = None
    after_answer: list[str] = []
    last_tag = ""
    block = 0
    pos = 0
    while True:
        match = REACT_OPEN.search(text, pos)
        chunk = text[pos : match.start() if match else len(text)]
        stray = REACT_CLOSE.search(chunk)
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
                no_unanswered(dict(enumerate(pending)), f"before the next tool call ({where})")
            steps.append(Step(react_call(inner, where), join_text(*split_think("".join(outside)))))
            pending.append(steps[-1])
            outside.clear()
        elif tag == "tool_response":
            if not pending:
                raise ConversionError(where, "tool response with no matching tool call")
            pending.pop(0).response = Response(inner.strip(), where)
        else:
            no_unanswered(dict(enumerate(pending)), f"before the final answer ({where})")
            answer_parts = (join_text(*split_think("".join(outside))), inner)
            outside.clear()
        last_tag = tag
    turns = build_turns(steps, tools)
    if answer_parts is not None:
        reasoning, inner = answer_parts
        turns.append(answer_turn(join_text(reasoning, *split_think("".join(after_answer))), f"<answer>{inner}"))
    elif "".join(outside).strip():
        if pending:
            offset = len(text) - len("".join(outside))
            raise ConversionError(f"offset {offset}", "text after a tool call that has no response")
        thinking, final = split_think("".join(outside))
        turns.append(answer_turn(thinking, final))
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
