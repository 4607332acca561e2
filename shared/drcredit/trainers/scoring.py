"""Scoring a step's token rollouts: groups posted as one batch, advantages spread over tokens.

A trainer-side rollout is a token sequence plus, per turn, its API form and token span
(a *turn record*, :mod:`drcredit.trainers.records`). :func:`score_step` turns a step's
rollouts into groups, posts them as one batch through the SDK, waits (riding out an outage
of the service up to a deadline, :mod:`drcredit.trainers.service`) and spreads each turn's
advantage over its tokens; :meth:`ScoredBatch.padded` lays the result out as a trainer's
``(batch, length)`` arrays. Every adapter goes through here; nothing here imports a trainer
library.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from drcredit.trainers import service
from drcredit.trainers.converters import group_from_rollouts
from drcredit.trainers.records import (
    TURNS_KEY,
    conversation_record,
    error_record,
    make_turn_record,
    read_turn_record,
    tool_call_message,
)
from drcredit.trainers.settings import DrCreditSettings, plain_value
from drcredit.trainers.tokens import broadcast_advantages, turn_advantages

__all__ = [
    "TURNS_KEY",
    "DrCreditSettings",
    "ScoredBatch",
    "TokenRollout",
    "conversation_record",
    "error_record",
    "make_turn_record",
    "plain_value",
    "read_turn_record",
    "safe_id",
    "score_step",
    "score_token_rollouts",
    "scored_from_documents",
    "token_values",
    "tool_call_message",
    "turns_to_train",
]

_ID_CHARS = re.compile(r"[^A-Za-z0-9_.:-]")


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
    #: the advantages document of each group, by group id
    documents: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: per row, the policy tokens of turns the service left out (``train_masks``' complement
    #: within the policy tokens)
    excluded: list[npt.NDArray[np.bool_]] = field(default_factory=list)

    @property
    def excluded_tokens(self) -> int:
        return int(sum(int(m.sum()) for m in self.excluded))

    def padded(
        self, width: int, rows: Sequence[int] | None = None
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
        """``(advantages, keep)`` as ``(len(rows), width)`` arrays (all rows by default).

        Values past a row's own length are 0 and a row longer than ``width`` is cut. ``keep``
        is False exactly on the tokens of turns the service left out, so ``trainer_mask &=
        keep`` is all an adapter does to take them out of the loss.
        """
        picked = list(range(len(self.values))) if rows is None else list(rows)
        values = np.zeros((len(picked), width), dtype=np.float32)
        keep = np.ones((len(picked), width), dtype=np.bool_)
        for b, row in enumerate(picked):
            row_values = self.values[row][:width]
            values[b, : row_values.shape[0]] = row_values
            if self.excluded:
                left_out = self.excluded[row][:width]
                keep[b, : left_out.shape[0]] = ~left_out
        return values, keep


def score_step(
    rollouts: Sequence[TokenRollout],
    settings: DrCreditSettings,
    *,
    client: Any = None,
    step: int | None = None,
    label: str | None = None,
) -> ScoredBatch:
    """Score one training step's rollouts with ``settings``: every adapter's single way in.

    ``client`` defaults to one made from ``settings`` for this call (and closed after it).
    ``step`` files the groups under ``settings.run`` at that step (``metadata``). Raises
    rather than return a partial result: ``DrCreditTimeout`` past ``timeout_s``,
    :class:`~drcredit.trainers.service.DrCreditUnavailable` past ``unreachable_timeout_s``
    of outage, ``GroupFailed`` for a group the service failed.
    """
    own = client is None
    client = service.make_client(settings) if own else client
    try:
        return score_token_rollouts(
            rollouts,
            client=client,
            timeout_s=settings.timeout_s,
            unreachable_timeout_s=settings.unreachable_timeout_s,
            progress=settings.progress,
            id_prefix=settings.id_prefix,
            params=settings.params,
            metadata=settings.metadata(step),
            label=label or ("training step" if step is None else f"training step {step}"),
        )
    finally:
        if own:
            client.close()


def score_token_rollouts(
    rollouts: Sequence[TokenRollout],
    *,
    client: Any,
    timeout_s: float,
    id_prefix: str = "",
    params: Mapping[str, Any] | None = None,
    metadata: Any = None,
    unreachable_timeout_s: float | None = None,
    progress: bool = False,
    label: str = "training step",
) -> ScoredBatch:
    """Post one group per ``group_key`` as one batch, wait, and return per-token advantages per row.

    ``client`` is a :class:`drcredit.client.DrCreditClient` (``submit_batch``, ``wait_for_batch``).
    Group and batch ids are content-addressed (``id_prefix`` + key + a hash of the group), so a
    retried step, or several data-parallel ranks posting the same groups, reuse the same
    groups on the server instead of conflicting with them. ``unreachable_timeout_s`` (default
    ``timeout_s``) bounds how long an unreachable service is waited for.
    """
    groups, order = _groups(rollouts, id_prefix, params, metadata)
    if not groups:
        return ScoredBatch("", [], [])
    digest = hashlib.sha256("\n".join(g["group_id"] for g in groups).encode()).hexdigest()[:24]
    batch_id = safe_id(f"{id_prefix}batch-{digest}")
    deadline = service.StepDeadline(
        timeout_s,
        timeout_s if unreachable_timeout_s is None else unreachable_timeout_s,
        label,
        str(getattr(client, "base_url", "?")),
    )
    document = service.post_and_wait(client, groups, batch_id, deadline, progress=progress)
    by_id = {str(d.get("group_id")): d for d in document.get("groups", []) if isinstance(d, Mapping)}
    return scored_from_documents(rollouts, order, by_id, batch_id=batch_id)


def scored_from_documents(
    rollouts: Sequence[TokenRollout],
    group_ids: Sequence[str],
    documents: Mapping[str, Mapping[str, Any]],
    *,
    batch_id: str = "",
) -> ScoredBatch:
    """Per-token advantages and train masks of each row, from its group's advantages document."""
    out: list[npt.NDArray[np.float32]] = []
    masks: list[npt.NDArray[np.bool_]] = []
    excluded_masks: list[npt.NDArray[np.bool_]] = []
    for row, group_id in zip(rollouts, group_ids, strict=True):
        doc = documents.get(group_id)
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
        excluded = policy & (token_values(left_out, row.spans, row.policy_mask, where=where) >= 1.0)
        masks.append(policy & ~excluded)
        excluded_masks.append(excluded)
    kept = {str(k): dict(v) for k, v in documents.items()}
    return ScoredBatch(batch_id, list(group_ids), out, masks, kept, excluded_masks)


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
