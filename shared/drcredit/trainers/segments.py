"""Token-level trajectories back into turns: a response's token ids and its policy mask.

Trainers that keep only tokens (SkyRL's generator output, slime's and OpenRLHF's samples)
still know which tokens the policy generated. Each maximal run of policy tokens is one
assistant generation and each run between them is what the tools answered. Decoded, the
generations name their tool calls inline, in one of two styles:

* Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, answered by
  ``<tool_response>...</tool_response>`` blocks;
* Search-R1 / ASearcher tags: ``<search>query</search>``, ``<access>url</access>`` (or
  ``<visit>``), answered by ``<information>...</information>``.

A generation without a call that ends the trajectory is the answer. :func:`record_from_tokens`
rebuilds the chat messages and gives each turn its generation's token span.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from drcredit.trainers.converters import ConversionError, ToolNames, from_react_text
from drcredit.trainers.records import (
    conversation_record,
    error_record,
    no_turns_record,
    read_turn_record,
    record_spans,
)
from drcredit.trainers.scoring import TokenRollout
from drcredit.trainers.steps import TEMPLATE_MARKER
from drcredit.trainers.tokens import policy_spans

_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_TAGGED = re.compile(r"<(search|access|visit)>(.*?)</\1>", re.S)
_ANSWERS = re.compile(r"<(tool_response|information)>(.*?)</\1>", re.S)


def plain_text(text: str) -> str:
    """Decoded tokens without ChatML's markers (``<|im_start|>role``, ``<|im_end|>``)."""
    return TEMPLATE_MARKER.sub("", text).strip()


def assistant_message(text: str, tools: ToolNames = ToolNames()) -> dict[str, Any]:
    """One generation's text as a chat message whose inline tool calls are ``tool_calls``."""
    calls: list[dict[str, Any]] = []
    for match in _HERMES.finditer(text):
        body = match.group(1).strip()
        try:
            parsed = json.loads(body)
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, Mapping) or not isinstance(parsed.get("name"), str):
            # an unreadable call still is a call: a tool turn the converter reports or keeps
            parsed = {"name": "unparsed_tool_call", "arguments": {"text": body}}
        arguments = parsed.get("arguments", parsed.get("parameters")) or {}
        calls.append({"type": "function", "function": {"name": parsed["name"], "arguments": arguments}})
    content = _HERMES.sub("", text)
    for match in _TAGGED.finditer(content):
        tag, inner = match.group(1), match.group(2).strip()
        if tag == "search":
            name = "search" if "search" in tools.search else tools.search[0]
            calls.append({"type": "function", "function": {"name": name, "arguments": {"query": inner}}})
        else:
            name = "visit" if "visit" in tools.visit else tools.visit[0]
            calls.append({"type": "function", "function": {"name": name, "arguments": {"url": inner}}})
    content = _TAGGED.sub("", content)
    message: dict[str, Any] = {"role": "assistant", "content": content.strip()}
    if calls:
        message["tool_calls"] = calls
    return message


def tool_messages(text: str, calls: int) -> list[dict[str, Any]]:
    """What the tools answered, one message per ``<tool_response>`` / ``<information>`` block
    (the whole text answers a single call when there is no block)."""
    blocks = [m.group(2).strip() for m in _ANSWERS.finditer(text)]
    if not blocks and text.strip() and calls:
        blocks = [text.strip()]
    return [{"role": "tool", "content": block} for block in blocks]


def record_from_tokens(
    response_ids: Sequence[int],
    policy_mask: Sequence[int] | npt.NDArray[Any],
    decode: Callable[[list[int]], str],
    *,
    tools: ToolNames = ToolNames(),
    question: str | None = None,
    rubrics: Sequence[Mapping[str, Any]] | None = None,
    final_observation: str | None = None,
) -> dict[str, Any]:
    """The turn record of one token-level trajectory (spans in response-token coordinates).

    ``final_observation``: the tools' answer to the last generation's calls when it is not
    in the tokens (SkyRL drops the observation of the step that ends a trajectory).

    ``decode`` turns token ids into text with the special tokens kept (e.g.
    ``lambda ids: tokenizer.decode(ids, skip_special_tokens=False)``). A trajectory that
    cannot be read becomes a record with ``error``, which the adapter reports by row.
    """
    ids = list(response_ids)
    mask = np.asarray(policy_mask, dtype=np.int64)
    if mask.shape != (len(ids),):
        return error_record(f"{len(ids)} response tokens but a policy mask of shape {mask.shape}")
    runs = policy_spans(mask)
    if not runs:
        return no_turns_record("the response has no policy tokens")
    messages: list[dict[str, Any]] = []
    generations: list[tuple[tuple[int, int], int | None]] = []
    for k, (start, end) in enumerate(runs):
        message = assistant_message(plain_text(decode(ids[start:end])), tools)
        generations.append(((start, end), len(messages)))
        messages.append(message)
        gap_end = runs[k + 1][0] if k + 1 < len(runs) else len(ids)
        calls = len(message.get("tool_calls") or [])
        if gap_end > end:
            messages.extend(tool_messages(plain_text(decode(ids[end:gap_end])), calls))
        elif k + 1 == len(runs) and calls and final_observation:
            messages.extend(tool_messages(plain_text(final_observation), calls))
    return conversation_record(messages, generations, tools=tools, question=question, rubrics=rubrics)


def token_rollout(
    group_key: str,
    rollout_id: str,
    response_ids: Sequence[int],
    policy_mask: Sequence[int] | npt.NDArray[Any],
    decode: Callable[[list[int]], str],
    *,
    question: str,
    rubrics: Sequence[Mapping[str, Any]],
    outcome_reward: float | None,
    tools: ToolNames = ToolNames(),
) -> TokenRollout:
    """One token-level trajectory as a row for :func:`drcredit.trainers.scoring.score_step`.

    The glue of a trainer without an adapter: build one row per sample (rows with the same
    ``group_key`` form a group), score the step, and read ``scored.values[i]``, the ``i``-th
    row's per-token advantages over its response (0 off the policy tokens).
    """
    where = f"group {group_key} rollout {rollout_id}"
    record = read_turn_record(record_from_tokens(response_ids, policy_mask, decode, tools=tools), where)
    return TokenRollout(
        group_key=str(group_key),
        rollout_id=str(rollout_id),
        question=question,
        rubrics=[dict(r) for r in rubrics],
        turns=record["turns"],
        spans=record_spans(record),
        policy_mask=np.asarray(policy_mask, dtype=np.int64),
        outcome_reward=outcome_reward,
    )


def from_search_r1_text(
    text: str,
    *,
    rollout_id: str,
    outcome_reward: float | None = None,
    tools: ToolNames = ToolNames(),
) -> dict[str, Any]:
    """Convert one Search-R1 / ASearcher transcript into a rollout dict that validates as ``Rollout``.

    ``<search>query</search>`` is a search call, ``<access>url</access>`` (or ``<visit>``) a
    visit, each answered by the next ``<information>...</information>``; the final
    ``<answer>...</answer>`` is the answer. The calls become the ReAct form of
    :func:`drcredit.trainers.converters.from_react_text`, which reads the rest (and names
    the block that cannot be read).
    """
    if not isinstance(text, str):
        raise ConversionError("text", f"expected a string, got {type(text).__name__}")

    def call(match: re.Match[str]) -> str:
        message = assistant_message(match.group(0), tools)
        function = message["tool_calls"][0]["function"]
        return (
            "<tool_call>" + json.dumps({"name": function["name"], "arguments": function["arguments"]}) + "</tool_call>"
        )

    react = _TAGGED.sub(call, text)
    react = re.sub(r"<information>(.*?)</information>", r"<tool_response>\1</tool_response>", react, flags=re.S)
    return from_react_text(react, rollout_id=rollout_id, outcome_reward=outcome_reward, tools=tools)
