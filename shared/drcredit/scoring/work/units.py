"""What every kind of work unit shares: the claimed unit, its outcomes, its writes.

A unit kind (a visit chain, a snippet call, an outcome judgment) is a coroutine that
takes a :class:`Claimed` unit, makes its judge calls and stores each answer as a
:class:`Write` through the batch writer, under the unit's lease (see
:mod:`drcredit.scoring.work.unit_kinds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from drcredit.domain.group import SearchResult
from drcredit.domain.outcome import ReportFacts
from drcredit.domain.params import ScoringParams
from drcredit.judges.base import JudgeResult
from drcredit.storage.bulk import JudgmentRow
from drcredit.tenancy.owner import Owner

#: What storing a judgment came to: ``duplicate``, another delivery stored it first;
#: ``lost``, the unit is no longer this delivery's (its group failed, its lease passed on).
StoreOutcome = Literal["stored", "duplicate", "lost"]
UnitOutcome = Literal["done", "noop", "stopped", "busy"]


class Stopping(Exception):
    """The process is stopping: the unit returns after its current judge call, resumable."""


@dataclass(frozen=True)
class Claimed:
    """A unit this delivery holds the lease of, and where it left off."""

    unit_id: int
    group_pk: int
    rollout_id: str
    rubric_id: str
    turn_index: int
    dedupe_turns: frozenset[int]
    params: ScoringParams
    done: frozenset[int]
    history: tuple[str, ...]
    snippet_done: bool
    #: A snippet call's eligible results, stored at ingest (None: read the rollout).
    payload: tuple[SearchResult, ...] | None = None
    #: Delivered before: something of it may be stored already.
    resumed: bool = False
    #: An outcome unit's calls (``kind\x1fkey``) that may have an identical twin in the group.
    twin_calls: frozenset[str] = frozenset()
    #: An outcome unit's report facts as ingest stored them (None for the other kinds).
    facts: ReportFacts | None = None
    #: Whose judge calls the unit makes (the fleet's fair shares).
    owner: Owner = field(default_factory=Owner)


@dataclass(frozen=True)
class Write:
    """One write for the batch writer: a judgment (with the lease to renew) and/or, with
    ``finish``, a unit to mark done (with a judgment: only once it is stored)."""

    judgment: JudgmentRow | None = None
    lease: tuple[int, str] | None = None
    finish: tuple[int, int] | None = None
    #: (group, rollout) whose waiting snippet calls this judgment may decide, with the
    #: group's params.
    release: tuple[tuple[int, str], ScoringParams] | None = None


def judgment_values(
    group_pk: int,
    kind: str,
    rollout_id: str,
    turn_index: int,
    rubric_id: str,
    key: str | None,
    result: JudgeResult[Any],
    cached: bool,
) -> dict[str, Any]:
    """A judgment's column values. A reused answer (``cached``: a twin's in the group, or
    the tenant's store's, ``result.reused``) made no call: no tokens, no attempts, but the
    endpoint and model that gave the answer."""
    cached = cached or result.reused
    endpoint, served_model = result.answered_by
    return {
        "group_pk": group_pk,
        "kind": kind,
        "rollout_id": rollout_id,
        "turn_index": turn_index,
        "rubric_id": rubric_id,
        "status": result.status,
        "answer": result.answer,
        "request_key": key,
        "cache_hit": cached,
        "reused": result.reused,
        "prompt_layout": result.prompt_layout,
        "backend": result.backend,
        "model": result.model,
        "served_model": served_model,
        "endpoint": endpoint,
        "failure_reason": result.failure_reason,
        "latency_s": 0.0 if cached else result.latency_s,
        "prompt_tokens": 0 if cached else result.prompt_tokens,
        "completion_tokens": 0 if cached else result.completion_tokens,
        "cached_prompt_tokens": 0 if cached else result.cached_tokens,
        "estimated_prompt_tokens": 0 if cached else result.estimated_prompt_tokens,
        "attempt_count": 0 if cached else len(result.attempts),
        # A cache hit made no attempt of its own.
        "attempts": [] if cached else [vars(a) for a in result.attempts],
        "created_at": datetime.now(UTC),
    }
