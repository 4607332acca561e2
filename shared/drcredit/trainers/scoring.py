"""What the VeRL and TRL adapters share: settings, turn records, scoring token rollouts.

A trainer-side rollout is a token sequence plus, per turn, its API form and token span
(a *turn record*). These helpers turn a step's rollouts into groups, post them as one
batch through the SDK, wait, and spread each turn's advantage over its tokens. Nothing
here imports a trainer library.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from drcredit.trainers.converters import ConversionError, ToolNames, from_chat_messages, group_from_rollouts
from drcredit.trainers.tokens import broadcast_advantages, turn_advantages

#: Key of the per-sample turn record (VeRL ``extra_fields``/``non_tensor_batch``, TRL outputs).
TURNS_KEY = "drcredit_turns"

RECORD_VERSION = 1
_ID_CHARS = re.compile(r"[^A-Za-z0-9_.:-]")


# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class DrCreditSettings:
    """Where the service is and how scoring is done; see :meth:`from_config`."""

    base_url: str | None = None
    api_key: str | None = None
    timeout_s: float = 1800.0
    id_prefix: str = ""
    params: Mapping[str, Any] | None = None
    tool_names: ToolNames = field(default_factory=ToolNames)
    #: The training run the groups belong to (``metadata.run``, for the viewer and analytics).
    run: str | None = None

    def metadata(self, step: int | None) -> dict[str, Any] | None:
        """``metadata.run`` and ``metadata.step`` of this step's groups (None without a run)."""
        if not self.run:
            return None
        return {"run": self.run} if step is None else {"run": self.run, "step": int(step)}

    @classmethod
    def from_config(cls, config: Any = None) -> DrCreditSettings:
        """Read ``config["drcredit"]`` (e.g. VeRL's ``algorithm`` section), then the environment.

        Keys: ``base_url`` (else ``$DRCREDIT_URL``, else the SDK's default), ``api_key`` (else
        ``$DRCREDIT_API_KEY``), ``timeout_s`` (else ``$DRCREDIT_WAIT_TIMEOUT_S``, else 1800: how
        long a training step waits for its batch), ``id_prefix`` (else ``$DRCREDIT_ID_PREFIX``:
        prepended to group and batch ids, e.g. the run name), ``params`` (parameter
        overrides for every group, docs/parameters.md), ``search_tools`` / ``visit_tools`` (tool names, for the
        agent loop's conversion), ``run`` (else ``$DRCREDIT_RUN``, else ``id_prefix`` without
        its trailing separator: the run the groups are filed under, with the trainer's step).
        """
        section = _section(config)
        defaults = ToolNames()
        timeout = section.get("timeout_s", os.environ.get("DRCREDIT_WAIT_TIMEOUT_S"))
        params = section.get("params")
        prefix = str(section.get("id_prefix") or os.environ.get("DRCREDIT_ID_PREFIX") or "")
        return cls(
            base_url=_opt_str(section.get("base_url")) or os.environ.get("DRCREDIT_URL") or None,
            api_key=_opt_str(section.get("api_key")) or os.environ.get("DRCREDIT_API_KEY") or None,
            timeout_s=float(timeout) if timeout not in (None, "") else 1800.0,
            id_prefix=prefix,
            run=(_opt_str(section.get("run")) or os.environ.get("DRCREDIT_RUN") or prefix.rstrip("-_.:") or None),
            params=plain_value(params) if params is not None else None,
            tool_names=ToolNames(
                search=tuple(plain_value(section.get("search_tools")) or defaults.search),
                visit=tuple(plain_value(section.get("visit_tools")) or defaults.visit),
            ),
        )


def _section(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    getter = getattr(config, "get", None)
    value = getter("drcredit", None) if callable(getter) else None
    plain = plain_value(value) if value is not None else {}
    if not isinstance(plain, dict):
        raise ValueError(f"algorithm.drcredit must be a mapping, got {type(plain).__name__}")
    return plain


def plain_value(value: Any) -> Any:
    """OmegaConf containers, numpy scalars/arrays and mappings as plain Python values."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    to_container = getattr(sys.modules.get("omegaconf"), "OmegaConf", None)
    if to_container is not None and type(value).__module__.startswith("omegaconf"):
        return to_container.to_container(value, resolve=True)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    return value


def _opt_str(value: Any) -> str | None:
    return None if value in (None, "") else str(value)


# ----------------------------------------------------------------------------- the turn record


def make_turn_record(
    turns: Sequence[Mapping[str, Any]],
    spans: Sequence[tuple[int, int] | Sequence[int] | None],
    *,
    question: str | None = None,
    rubrics: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The value stored under :data:`TURNS_KEY` for one sample.

    ``turns`` are API turns (docs/method.md, "Input"). ``spans[t]`` is turn ``t``'s half-open token
    span ``[start, end)`` in the *response* tokens (index 0 = first response token), or None
    for a turn with no tokens in the response (cut by the response length). Turns made by one
    assistant message (several tool calls) share that message's span; its tokens then get the
    mean of their advantages. ``question`` / ``rubrics`` may be copied here by the agent loop;
    otherwise the estimator reads them from ``non_tensor_batch["extra_info"]``.
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
    return value


# ----------------------------------------------------------------------------- trainer-agnostic scoring


@dataclass
class TokenRollout:
    """One sampled response, with what the service needs and where its turns are in the tokens.

    Rows with the same ``group_key`` form one group (one question, ``G >= 2`` rollouts).
    ``policy_mask`` is the response's 1-D mask of policy-generated tokens (tool observations
    and padding 0).
    """

    group_key: str
    rollout_id: str
    question: str
    rubrics: list[dict[str, Any]]
    turns: list[dict[str, Any]]
    spans: list[tuple[int, int] | None]
    policy_mask: npt.NDArray[Any]
    outcome_reward: float | None = None


@dataclass
class ScoredBatch:
    """What :func:`score_token_rollouts` returns: ids to look the scoring up, and the values."""

    batch_id: str
    #: per row, the id of its group on the service (``GET /v1/groups/{id}/credits`` explains it)
    group_ids: list[str]
    #: per row, float32 per-token advantages of the length of its ``policy_mask``
    values: list[npt.NDArray[np.float32]]
    #: per row, the policy tokens to learn from: ``policy_mask`` without the tokens of turns
    #: the service left out (:func:`turns_to_train`); the adapters mask the others out of
    #: the loss instead of training them on a made-up zero.
    train_masks: list[npt.NDArray[np.bool_]] = field(default_factory=list)

    @property
    def excluded_tokens(self) -> int:
        return int(sum(int(m.size - m.sum()) for m in self.train_masks))


def score_token_rollouts(
    rollouts: Sequence[TokenRollout],
    *,
    client: Any,
    timeout_s: float,
    id_prefix: str = "",
    params: Mapping[str, Any] | None = None,
    metadata: Any = None,
) -> ScoredBatch:
    """Post one group per ``group_key`` as one batch, wait, and return per-token advantages per row.

    ``client`` is a :class:`drcredit.client.DrCreditClient` (``submit_batch``, ``wait_for_batch``).
    Group and batch ids are content-addressed (``id_prefix`` + key + a hash of the group), so a
    retried step, or several data-parallel ranks posting the same groups, reuse the same
    groups on the server instead of conflicting with them.
    """
    groups, order = _groups(rollouts, id_prefix, params, metadata)
    if not groups:
        return ScoredBatch("", [], [])
    digest = hashlib.sha256("\n".join(g["group_id"] for g in groups).encode()).hexdigest()[:24]
    batch_id = safe_id(f"{id_prefix}batch-{digest}")
    answer = client.submit_batch(groups, batch_id=batch_id)
    batch_id = str(answer.get("batch_id", batch_id)) if isinstance(answer, Mapping) else batch_id
    document = client.wait_for_batch(batch_id, timeout=timeout_s)
    by_id = {d.get("group_id"): d for d in document.get("groups", []) if isinstance(d, Mapping)}
    out: list[npt.NDArray[np.float32]] = []
    masks: list[npt.NDArray[np.bool_]] = []
    for row, group_id in zip(rollouts, order, strict=True):
        doc = by_id.get(group_id)
        if doc is None:
            raise ValueError(f"batch {batch_id}: the service returned no advantages for group {group_id}")
        values = turn_advantages(doc, row.rollout_id)
        if len(values) != len(row.turns):
            raise ValueError(
                f"group {group_id} rollout {row.rollout_id}: {len(values)} turn advantages for {len(row.turns)} turns"
            )
        where = f"rollout {row.rollout_id}"
        out.append(token_values(values, row.spans, row.policy_mask, where=where))
        left_out = [0.0 if trained else 1.0 for trained in turns_to_train(doc, row.rollout_id)]
        policy = np.asarray(row.policy_mask).astype(np.bool_)
        masks.append(policy & (token_values(left_out, row.spans, row.policy_mask, where=where) < 1.0))
    return ScoredBatch(batch_id, order, out, masks)


def turns_to_train(document: Mapping[str, Any], rollout_id: str) -> list[bool]:
    """Per turn of one rollout of a group's advantages document: whether to learn from it.

    Under ``on_judge_failure: exclude`` the service leaves unscorable turns out of the
    normalization; a trainer should leave them out of the loss too, rather than train them
    on an advantage that stands in for a judgment that failed. A rollout whose
    ``outcome_reward`` the service could not judge (null among non-null rewards) is left
    out whole. Under the other policies every turn is trained.
    """
    params = document.get("params") or {}
    rollouts = [r for r in document.get("rollouts", []) if isinstance(r, Mapping)]
    rollout = next((r for r in rollouts if r.get("id") == rollout_id), None)
    if rollout is None:
        raise ValueError(f"rollout {rollout_id!r} is not in the advantages document")
    turns = list(rollout.get("turns") or [])
    if params.get("on_judge_failure") != "exclude":
        return [True] * len(turns)
    rewarded = [r.get("outcome_reward") is not None for r in rollouts]
    if rollout.get("outcome_reward") is None and any(rewarded):
        return [False] * len(turns)
    return [not t.get("unscorable", False) for t in sorted(turns, key=lambda t: int(t.get("index", 0)))]


def token_values(
    advantages: Sequence[float],
    spans: Sequence[tuple[int, int] | None],
    policy_mask: npt.ArrayLike,
    *,
    where: str = "rollout",
) -> npt.NDArray[np.float32]:
    """Per-token advantages of one response from per-turn advantages and the recorded spans.

    Turns sharing a span (one assistant message making several tool calls) give its tokens
    their mean. A turn without a span, or whose span starts past the response (cut by the
    response length), has no tokens and is skipped; a span running past the end is clipped.
    Everything else is :func:`broadcast_advantages`, with its strict checks.
    """
    mask = np.asarray(policy_mask)
    n = int(mask.shape[0])
    merged: list[tuple[tuple[int, int], list[float]]] = []
    for advantage, span in zip(advantages, spans, strict=True):
        if span is None:
            continue
        start, end = int(span[0]), int(span[1])
        if merged and merged[-1][0] == (start, end):
            merged[-1][1].append(float(advantage))
            continue
        merged.append(((start, end), [float(advantage)]))
    kept_spans: list[tuple[int, int]] = []
    kept_values: list[float] = []
    for (start, end), values in merged:
        clipped = min(end, n)
        if start >= clipped or (clipped < end and not mask[start:clipped].any()):
            continue  # cut off by the response length: no token to train
        kept_spans.append((start, clipped))
        kept_values.append(math.fsum(values) / len(values))
    try:
        return broadcast_advantages(kept_values, kept_spans, mask)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _groups(
    rollouts: Sequence[TokenRollout], id_prefix: str, params: Mapping[str, Any] | None, metadata: Any
) -> tuple[list[dict[str, Any]], list[str]]:
    members: dict[str, list[TokenRollout]] = {}
    for row in rollouts:
        members.setdefault(row.group_key, []).append(row)
    groups: list[dict[str, Any]] = []
    ids: dict[str, str] = {}
    for key, rows in members.items():
        first = rows[0]
        if len(rows) < 2:
            raise ValueError(
                f"group {key!r} has {len(rows)} rollout: DrCredit needs at least 2 per question (rollout.n)"
            )
        for row in rows[1:]:
            if row.question != first.question or row.rubrics != first.rubrics:
                raise ValueError(
                    f"group {key!r}: rollouts {first.rollout_id} and {row.rollout_id} differ in question/rubrics"
                )
        seen: set[str] = set()
        for row in rows:
            if row.rollout_id in seen:
                raise ValueError(f"group {key!r}: rollout id {row.rollout_id!r} appears twice")
            seen.add(row.rollout_id)
        rewards = [row.outcome_reward for row in rows]
        # With outcome_source "judge" the service computes the reward (docs/method.md, "Outcome reward"):
        # the trainer's own is not sent (the service would refuse it).
        judged = (params or {}).get("outcome_source") == "judge"
        docs = []
        for row in rows:
            doc: dict[str, Any] = {"id": row.rollout_id, "turns": row.turns}
            if not judged and all(r is not None for r in rewards):
                doc["outcome_reward"] = row.outcome_reward
            docs.append(doc)
        body = group_from_rollouts(first.question, first.rubrics, docs, params=params, metadata=metadata)
        content = json.dumps(
            {k: body[k] for k in ("question", "rubrics", "rollouts", "params") if k in body}, sort_keys=True
        )
        digest = hashlib.sha256(content.encode()).hexdigest()[:20]
        head = safe_id(f"{id_prefix}{key}")[: 128 - len(digest) - 1]
        body["group_id"] = f"{head}-{digest}"
        ids[key] = body["group_id"]
        groups.append(body)
    return groups, [ids[row.group_key] for row in rollouts]


def safe_id(text: str) -> str:
    return _ID_CHARS.sub("-", text)[:128]


def make_client(settings: DrCreditSettings) -> Any:
    from drcredit.client import DrCreditClient

    return DrCreditClient(settings.base_url, api_key=settings.api_key)


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
    conversion failure becomes a record with ``error`` (the estimator then names the row).
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
