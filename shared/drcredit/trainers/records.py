"""The turn record: a rollout's API turns and where each turn's tokens are.

Every adapter reduces its trainer's sample to this record (VeRL's agent loop and TRL's
completions store it under :data:`TURNS_KEY`; SkyRL and prime-rl rows are converted on the
spot), so scoring, masking and broadcasting are written once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from drcredit.trainers.converters import ConversionError, ToolNames, from_chat_messages
from drcredit.trainers.settings import plain_value

#: Key of the per-sample turn record (VeRL ``extra_fields``/``non_tensor_batch``, TRL outputs).
TURNS_KEY = "drcredit_turns"

RECORD_VERSION = 1
log = logging.getLogger("drcredit.trainers")


def make_turn_record(
    turns: Sequence[Mapping[str, Any]],
    spans: Sequence[tuple[int, int] | Sequence[int] | None],
    *,
    question: str | None = None,
    rubrics: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The value stored under :data:`TURNS_KEY` for one sample.

    ``turns`` are API turns (docs/api.md). ``spans[t]`` is turn ``t``'s half-open token
    span ``[start, end)`` in the *response* tokens (index 0 = first response token), or None
    for a turn with no tokens in the response (cut by the response length). Turns made by one
    assistant message (several tool calls) share that message's span; its tokens then get the
    mean of their advantages. ``question`` / ``rubrics`` may be copied here by the agent loop;
    otherwise the adapter reads them from the sample's own fields.
    """
    if len(turns) != len(spans):
        raise ValueError(f"{len(turns)} turns but {len(spans)} spans: one span (or None) per turn")
    return {
        "version": RECORD_VERSION,
        "turns": [dict(t) for t in turns],
        "spans": [None if s is None else [int(s[0]), int(s[1])] for s in spans],
        "question": question,
        "rubrics": None if rubrics is None else [dict(r) for r in rubrics],
        "error": None,
    }


def error_record(message: str) -> dict[str, Any]:
    return {"version": RECORD_VERSION, "turns": [], "spans": [], "question": None, "rubrics": None, "error": message}


def no_turns_record(reason: str) -> dict[str, Any]:
    """The record of a response the policy generated no token of (a trainer's filter zeroed
    its mask, or the generation was empty): a rollout with no turns. It still counts in its
    group (its outcome reward in the outcome normalization, and a streaming group gets the
    rollout it waits for), has nothing to train, and does not stop the step;
    :func:`read_turn_record` logs ``reason`` with the row's name."""
    record = make_turn_record([], [])
    record["warning"] = f"{reason}: scored as a rollout with no turns"
    return record


def read_turn_record(value: Any, where: str) -> dict[str, Any]:
    """A stored record back as a dict (it may have become a JSON string or an OmegaConf node)."""
    if isinstance(value, (str, bytes)):
        value = json.loads(value)
    value = plain_value(value)
    if not isinstance(value, dict) or "turns" not in value or "spans" not in value:
        raise ValueError(
            f"{where}: no DrCredit turn record under {TURNS_KEY!r} (got {type(value).__name__}); "
            f"record the turns with an adapter's agent loop or write make_turn_record(...) into the sample"
        )
    if value.get("error"):
        raise ValueError(f"{where}: the rollout's turns could not be recorded: {value['error']}")
    if len(value["turns"]) != len(value["spans"]):
        raise ValueError(f"{where}: {len(value['turns'])} turns but {len(value['spans'])} spans")
    if value.get("warning"):
        log.warning("DrCredit: %s: %s", where, value["warning"])
    return value


def record_spans(record: Mapping[str, Any]) -> list[tuple[int, int] | None]:
    return [None if s is None else (int(s[0]), int(s[1])) for s in record["spans"]]


def conversation_record(
    messages: Sequence[Mapping[str, Any]],
    generations: Sequence[tuple[tuple[int, int], int | None]],
    *,
    tools: ToolNames,
    question: str | None = None,
    rubrics: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The turn record of a finished conversation (the generated messages, prompt excluded).

    ``generations[g] = (span, message_position)``: the token span of the ``g``-th assistant
    generation and the position in ``messages`` of the assistant message it produced. A
    conversion failure becomes a record with ``error`` (the adapter then names the row).
    """
    try:
        rollout = from_chat_messages(messages, rollout_id="r", tools=tools)
    except ConversionError as exc:
        return error_record(str(exc))
    assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    last = assistant[-1] if assistant else -1
    spans: list[tuple[int, int] | None] = []
    for span, position in generations:
        if position is None:
            continue
        calls = messages[position].get("tool_calls") or []
        count = len(calls) if calls else (1 if position == last else 0)
        spans.extend([span] * count)
    turns = rollout["turns"]
    if len(spans) != len(turns):
        return error_record(f"{len(turns)} turns for {len(spans)} recorded generation spans")
    return make_turn_record(turns, spans, question=question, rubrics=rubrics)


def tool_call_message(content: str, calls: Sequence[Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    return message


def question_and_rubrics(sources: Sequence[Any], where: str, hint: str) -> tuple[str, list[dict[str, Any]]]:
    """The first question and rubrics found in ``sources`` (mappings; a ``drcredit`` key inside
    one is looked at before the mapping itself); rubrics may be JSON text. ``hint`` names,
    in the error, where a user should put them."""
    candidates: list[Mapping[str, Any]] = []
    for source in sources:
        plain = plain_value(source)
        if not isinstance(plain, Mapping):
            continue
        nested = plain.get("drcredit")
        if isinstance(nested, Mapping):
            candidates.append(nested)
        candidates.append(plain)
    question = next((s["question"] for s in candidates if s.get("question")), None)
    rubrics = next((s["rubrics"] for s in candidates if s.get("rubrics")), None)
    if isinstance(rubrics, (str, bytes)):
        rubrics = json.loads(rubrics)
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: no question ({hint}['question'] or {hint}['drcredit']['question'])")
    if not isinstance(rubrics, list) or not rubrics:
        raise ValueError(f"{where}: no rubrics ({hint}['rubrics'] or {hint}['drcredit']['rubrics'])")
    return question, [dict(r) for r in rubrics]
