"""Ingest and judging of groups, one database-backed work unit at a time.

A group becomes work units when its rollouts arrive: one visit chain per (rollout,
positive rubric), one snippet call per search turn with eligible results. Units run as
coroutines on the process's :class:`~drcredit.scoring.engine.Engine`. A unit reads what
is already stored and continues from there, stores each judgment (batched with other
chains' judgments in one transaction) before its next judge call, and holds no
transaction open while the judge thinks; completion is counted in the ``groups`` row
and the unit that finishes last schedules the aggregation, once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import structlog
from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random

from drcredit import metrics
from drcredit.domain.advantages import GroupAdvantages, group_advantages
from drcredit.domain.batch import BatchIn
from drcredit.domain.credit import (
    Judgments,
    RolloutCredits,
    RolloutPlan,
    group_credits,
    plan_rollout,
    snippet_decision,
    visit_credit,
)
from drcredit.domain.dedupe import signatures, twin_turns
from drcredit.domain.errors import FieldError, InvalidInput
from drcredit.domain.group import (
    GroupContent,
    GroupIn,
    Rollout,
    Rubric,
    SearchResult,
    VisitTurn,
    is_valid_group_id,
    judged_reward_given,
)
from drcredit.domain.limits import Limits, group_limit_problems, rollout_limit_problems
from drcredit.domain.outcome import report_facts
from drcredit.domain.outline import outline_turns
from drcredit.domain.params import ScoringParams
from drcredit.domain.verdicts import (
    RejectedMatch,
    ScoreVerdict,
    SnippetMatch,
    SnippetVerdict,
    VisitVerdict,
)
from drcredit.judges.base import Judge, JudgeResult, SnippetJudgeRequest, VisitJudgeRequest
from drcredit.judges.breaker import JudgeUnavailable
from drcredit.scoring.content import (
    Dumped,
    canonical_hash,
    group_differences,
    group_hash,
    outlined_rollouts,
    params_of,
    parse_rubrics,
)
from drcredit.scoring.dispatch import Dispatcher, UnitRef
from drcredit.scoring.engine import BatchWriter, Engine, PrioritySlots, Recent
from drcredit.scoring.errors import Conflict, NotFound
from drcredit.scoring.events import GroupEvents, announce_final
from drcredit.scoring.leases import LeaseKeeper
from drcredit.scoring.outages import JudgeOutages
from drcredit.scoring.outcome_unit import run_outcome_unit
from drcredit.scoring.outcomes import (
    OUTCOME_KINDS,
    breakdown_json,
    call_signatures,
    group_breakdowns,
    planned_calls,
    twin_calls,
)
from drcredit.scoring.units import Claimed, StoreOutcome, UnitOutcome, Write, judgment_values
from drcredit.storage import models as m
from drcredit.storage import repository as repo
from drcredit.storage.bulk import JudgmentRow, copy_rows, store_judgments
from drcredit.storage.database import Database, is_connection_error, is_lock_conflict
from drcredit.storage.histories import support_histories

log = logging.getLogger("drcredit.pipeline")

#: Groups of a batch stored at once (each in its own transaction).
INGEST_THREADS = 3
R = TypeVar("R", VisitVerdict, SnippetVerdict, ScoreVerdict)
S = TypeVar("S")

#: Deliveries of one unit before its group is failed instead of retried again.
MAX_UNIT_ATTEMPTS = 5


class _Stopping(Exception):
    """The process is stopping while this unit waited for another's judge call."""


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Submitted:
    group_pk: int
    group_id: str
    status: str
    created: bool


@dataclass(frozen=True)
class _RolloutToStore:
    """A rollout arriving in a group, with what ingest computed for it."""

    position: int
    rollout: Rollout
    plan: RolloutPlan
    signatures: dict[str, list[int]]
    twins: set[int]


class Pipeline:
    """Ingest, unit execution and aggregation over one database and one judge."""

    def __init__(
        self,
        db: Database,
        judge: Judge,
        dispatcher: Dispatcher,
        *,
        default_failure_policy: str = "zero",
        lease_s: float = 120.0,
        worker_id: str | None = None,
        claims: bool = False,
        judge_concurrency: int = 64,
        db_threads: int = 6,
        write_linger_s: float = 0.05,
        store_patience_s: float = 600.0,
        limits: Limits | None = None,
    ):
        self.db = db
        self.lease_s = lease_s
        self.store_patience_s = store_patience_s
        self.limits = limits or Limits()
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        #: Claim judge requests in the database so that identical requests in flight in
        #: different processes are made once (distributed mode).
        self.claims = claims
        self.judge = judge
        self.dispatcher = dispatcher
        self.default_failure_policy = default_failure_policy
        #: Content per (group, rollout): a message carries one rollout's units, which
        #: share it (read from the engine loop and its database threads).
        self._content_cache: Recent[tuple[int, str], GroupContent] = Recent()
        #: Content loads in flight on the engine loop: a message's units start together
        #: and would otherwise each load (and validate) the same rollout.
        self._content_loads: dict[tuple[int, str], asyncio.Future[GroupContent]] = {}
        #: Rollouts with no waiting snippet call left (units never return to waiting).
        self._no_waiting: set[tuple[int, str]] = set()
        self._plans: Recent[tuple[int, str], RolloutPlan] = Recent()
        #: Question and positive rubrics per group, for snippet calls (which carry their
        #: results and need nothing else of the group). Filled by claims.
        self._headers: Recent[int, tuple[str, tuple[Rubric, ...]]] = Recent()
        self._group_params: Recent[int, ScoringParams] = Recent()
        #: Judge requests in flight on the engine loop (only touched from that loop).
        self._inflight: dict[tuple[int, str], asyncio.Future[JudgeResult[Any]]] = {}
        self._stopping = threading.Event()
        #: Long-polls of this process wait on these reports of finished groups.
        self.events = GroupEvents()
        self.engine = Engine(judge_concurrency, db_threads)
        self.engine.on_close(judge.aclose)
        self.outages = JudgeOutages(db, judge.breaker, self.engine.db)
        self.leases = LeaseKeeper(db, lease_s, self.engine.db)
        self.engine.on_close(self.leases.stop)
        self._writer: BatchWriter[Write, StoreOutcome] = BatchWriter(
            self.engine, self._write_batch, linger_s=write_linger_s
        )

    def stop(self) -> None:
        """Ask running chains to return after their current judge call (resumable)."""
        self._stopping.set()

    def resume(self) -> int:
        """Re-dispatch the unfinished work of every open group (after a restart).

        Units left ``running`` by a stopped process are queued again: they continue from
        their last stored judgment, so nothing is judged twice. Returns the units queued.
        """
        with self.db.session() as s:
            groups = list(s.scalars(select(m.Group.id).where(m.Group.status.in_(("queued", "running")))))
            s.execute(
                update(m.WorkUnit)
                .where(m.WorkUnit.group_pk.in_(groups), m.WorkUnit.status == "running")
                .values(status="queued", lease_owner=None, lease_expires_at=None)
            )
            waiting = s.execute(
                select(m.WorkUnit.group_pk, m.WorkUnit.rollout_id)
                .where(m.WorkUnit.group_pk.in_(groups), m.WorkUnit.status == "waiting")
                .distinct()
            ).all()
            s.execute(
                update(m.Group)
                .where(m.Group.id.in_(groups), m.Group.aggregation == "enqueued")
                .values(aggregation="pending")
            )
        queued = self._dispatch_queued(groups)
        for group_pk, rollout_id in waiting:
            self._release_snippets(group_pk, rollout_id)
        self._maybe_aggregate(groups)
        return queued

    # ================================================================== ingest

    def submit_group(
        self,
        tenant: str,
        group: GroupIn,
        *,
        position: int | None = None,
        prepared: tuple[Dumped, str] | None = None,
    ) -> Submitted:
        """Store a group in its own transaction and start judging it; idempotent on ``group_id``.

        ``position`` and ``prepared`` come from :meth:`submit_batch` (see :meth:`_store_group`).
        """
        if prepared is None:  # a batch's groups were checked together
            self.check_limits([group])
        try:
            with self.db.session() as s:
                submitted = self._store_group(s, tenant, group, position, prepared)
        except IntegrityError:
            # A concurrent post of the same group_id won the insert: answer as a re-post.
            with self.db.session() as s:
                submitted = self._store_group(s, tenant, group, position, prepared)
        self.start([submitted])
        return submitted

    def start(self, submitted: Sequence[Submitted]) -> None:
        """Dispatch the queued units of newly stored groups (after their commit), in order."""
        created = [sub.group_pk for sub in submitted if sub.created]
        if not created:
            return
        metrics.GROUPS_INGESTED.inc(len(created))
        self._dispatch_queued(created)
        # A group with nothing to judge (every call a deterministic zero or skipped) goes
        # straight to aggregation.
        self._maybe_aggregate(created)

    def check_limits(self, groups: Sequence[GroupIn], *, batch: bool = False) -> None:
        """Refuse groups over the service's size limits (a 422 naming each field)."""
        problems = []
        for i, group in enumerate(groups):
            for p in group_limit_problems(group, self.limits, group.expected_rollouts):
                problems.append(FieldError(f"groups[{i}].{p.field}", p.message) if batch else p)
        if problems:
            raise InvalidInput(problems)

    def resolve(self, group: GroupIn) -> GroupIn:
        """Fill the failure policy from settings when the group leaves it unset."""
        if "on_judge_failure" in group.params.model_fields_set:
            return group
        params = group.params.model_copy(update={"on_judge_failure": self.default_failure_policy})
        return group.model_copy(update={"params": params})

    def submit_batch(self, tenant: str, batch: BatchIn) -> tuple[str, list[Submitted], bool]:
        """Store a batch's groups and start each as soon as it is stored; idempotent on batch_id.

        Every input check (validation, a group_id taken by other content) runs before
        anything is written. Each group is then stored in its own transaction and its
        judging starts at once, so a step's judging overlaps its ingest; the batch row,
        written last, makes the batch visible. Re-posting after an interruption stores
        what is missing: the groups already stored are recognised by their group_id.
        """
        self.check_limits(batch.groups, batch=True)
        groups = [self.resolve(g) for g in batch.groups]
        batch_id = batch.batch_id or uuid.uuid4().hex
        # A group's JSON and hash are made when it is stored (in its ingest thread), so
        # the first group starts judging without waiting for the others to be dumped;
        # only a group_id already taken, or a re-posted batch, needs them up front.
        prepared: list[tuple[Dumped, str] | None] = [None] * len(groups)

        def prepare(i: int) -> tuple[Dumped, str]:
            made = prepared[i]
            if made is None:
                dumped = Dumped.of(groups[i])
                made = prepared[i] = (dumped, group_hash(groups[i], dumped))
            return made

        def digest() -> str:
            return canonical_hash([prepare(i)[1] for i in range(len(groups))] + [g.group_id for g in groups])

        with self.db.session() as s:
            existing = self._existing_batch(s, tenant, batch_id, digest)
            if existing is not None:
                return batch_id, existing, False
            named = {g.group_id: i for i, g in enumerate(groups) if g.group_id is not None}
            for group_id, stored_hash in s.execute(
                select(m.Group.group_id, m.Group.content_hash).where(
                    m.Group.tenant == tenant, m.Group.group_id.in_(list(named))
                )
            ):
                i = named[group_id]
                if stored_hash != prepare(i)[1]:
                    taken = s.scalars(
                        select(m.Group).where(m.Group.tenant == tenant, m.Group.group_id == group_id)
                    ).one()
                    differences = group_differences(s, taken, groups[i], prepare(i)[0])
                    raise Conflict(
                        f"groups[{i}]: group_id {group_id!r} already exists with different content",
                        [(f"groups[{i}].{field}", what) for field, what in differences],
                    )
        # Groups with the longest visit chains are stored (and start judging) first: the
        # step ends when its longest chain does, so that chain should not wait for the
        # ingest of the others.
        order = sorted(range(len(groups)), key=lambda i: -_longest_chain(groups[i]))
        by_position: dict[int, Submitted] = {}
        # On Postgres a few groups are stored at once: while one transaction waits on the
        # server (its COPY of turn bodies, its commit), another builds its rows. SQLite
        # has one writer at a time.
        threads = INGEST_THREADS if self.db.engine.dialect.name == "postgresql" else 1
        with ThreadPoolExecutor(threads, thread_name_prefix="drcredit-ingest") as pool:
            stored = pool.map(lambda i: self.submit_group(tenant, groups[i], position=i, prepared=prepare(i)), order)
            by_position.update(zip(order, stored, strict=True))
        submitted = [by_position[i] for i in range(len(groups))]
        try:
            with self.db.session() as s:
                row = m.Batch(
                    tenant=tenant, batch_id=batch_id, content_hash=digest(), group_ids=[x.group_id for x in submitted]
                )
                s.add(row)
                s.flush()
                created = {x.group_pk for x in submitted if x.created}
                # Judging has started: lock the group rows in id order, as the workers do.
                repo.lock_groups(s, created)
                s.execute(update(m.Group).where(m.Group.id.in_(sorted(created))).values(batch_pk=row.id))
        except IntegrityError:
            # A concurrent post of the same batch_id wrote the batch row first.
            with self.db.session() as s:
                existing = self._existing_batch(s, tenant, batch_id, digest)
            assert existing is not None
            return batch_id, existing, False
        return batch_id, submitted, True

    @staticmethod
    def _existing_batch(s: Session, tenant: str, batch_id: str, digest: Callable[[], str]) -> list[Submitted] | None:
        """The groups of an already stored batch (``digest``, its content's hash, is only
        made when there is one to compare with)."""
        existing = s.scalar(select(m.Batch).where(m.Batch.tenant == tenant, m.Batch.batch_id == batch_id))
        if existing is None:
            return None
        if existing.content_hash != digest():
            raise Conflict(f"batch_id {batch_id!r} already exists with different content")
        rows = s.execute(
            select(m.Group.id, m.Group.group_id, m.Group.status).where(
                m.Group.tenant == tenant, m.Group.group_id.in_(existing.group_ids)
            )
        ).all()
        by_id = {gid: Submitted(pk, gid, st, False) for pk, gid, st in rows}
        return [by_id[g] for g in existing.group_ids]

    def _store_group(
        self,
        s: Session,
        tenant: str,
        group: GroupIn,
        position: int | None,
        prepared: tuple[Dumped, str] | None = None,
    ) -> Submitted:
        """Store a group; ``prepared``: its rollouts' JSON and its hash, when already made."""
        group = self.resolve(group)
        dumped, digest = prepared or (None, None)
        if dumped is None or digest is None:
            dumped = Dumped.of(group)
            digest = group_hash(group, dumped)
        if group.group_id is not None:
            existing = s.scalar(select(m.Group).where(m.Group.tenant == tenant, m.Group.group_id == group.group_id))
            if existing is not None:
                if existing.content_hash != digest:
                    raise Conflict(
                        f"group_id {group.group_id!r} already exists with different content",
                        group_differences(s, existing, group, dumped),
                    )
                return Submitted(existing.id, existing.group_id, existing.status, False)
        group_id = group.group_id or uuid.uuid4().hex
        row = m.Group(
            tenant=tenant,
            group_id=group_id,
            batch_position=position,  # batch_pk is set with the batch row, written last
            content_hash=digest,
            question=group.question,
            rubrics=[r.model_dump(mode="json") for r in group.rubrics],
            params=group.params.model_dump(mode="json"),
            metadata_=group.metadata,
            expected_rollouts=group.expected_rollouts or len(group.rollouts),
            rollouts_received=0,
            status="queued",
            judge_backend=self.judge.backend,
            judge_model=self.judge.model,
            units_total=0,
            units_done=0,
            judgments_planned=0,
            aggregation="pending",
        )
        s.add(row)
        s.flush()
        params = params_of(row)
        plans = {r.id: plan_rollout(group, r, params) for r in group.rollouts}
        sigs = {r.id: signatures(r, plans[r.id]) for r in group.rollouts}
        twins = twin_turns(sigs)
        self._store_rollouts(
            s,
            row,
            group,
            dumped,
            [
                _RolloutToStore(position_, rollout, plans[rollout.id], sigs[rollout.id], twins[rollout.id])
                for position_, rollout in enumerate(group.rollouts)
            ],
        )
        s.flush()
        return Submitted(row.id, group_id, row.status, True)

    def add_rollout(self, tenant: str, group_id: str, rollout: Rollout) -> tuple[Submitted, bool]:
        """Add one rollout to an open streaming group; idempotent on the rollout id."""
        if not is_valid_group_id(group_id):
            raise NotFound(f"group {group_id!r} not found")
        problems = rollout_limit_problems(rollout, self.limits)
        if problems:
            raise InvalidInput(problems)
        with self.db.session() as s:
            row = s.scalar(
                select(m.Group).where(m.Group.tenant == tenant, m.Group.group_id == group_id).with_for_update()
            )
            if row is None:
                raise NotFound(f"group {group_id!r} not found")
            existing = s.scalar(
                select(m.Rollout).where(m.Rollout.group_pk == row.id, m.Rollout.rollout_id == rollout.id)
            )
            dumped = Dumped({rollout.id: rollout.model_dump(mode="json")})
            if existing is not None:
                if existing.content_hash != dumped.rollout_hash(rollout.id):
                    raise Conflict(
                        f"rollout {rollout.id!r} already exists in group {group_id!r} with different content"
                    )
                return Submitted(row.id, row.group_id, row.status, False), False
            if row.rollouts_received >= row.expected_rollouts:
                raise Conflict(f"group {group_id!r} already has all {row.expected_rollouts} rollouts")
            if row.status == "failed":
                raise Conflict(f"group {group_id!r} has failed: {row.error}")
            params = params_of(row)
            if params.outcome_source == "judge" and rollout.outcome_reward is not None:
                raise InvalidInput([judged_reward_given("outcome_reward")])
            rewarded = s.scalars(select(m.Rollout.outcome_reward).where(m.Rollout.group_pk == row.id)).all()
            if rewarded and params.outcome_source == "given":
                has = [r is not None for r in rewarded]
                if all(has) and rollout.outcome_reward is None:
                    raise _reward_error("missing; the group's other rollouts have an outcome_reward")
                if not any(has) and rollout.outcome_reward is not None:
                    raise _reward_error(
                        "given, but the group's other rollouts have none; give it on every rollout or on none"
                    )
            content = GroupContent.model_validate({"question": row.question, "rubrics": row.rubrics, "rollouts": []})
            plan = plan_rollout(content, rollout, params)
            sigs = signatures(rollout, plan)
            seen: set[str] = set()
            for earlier in s.scalars(select(m.Rollout.signatures).where(m.Rollout.group_pk == row.id)):
                seen.update(earlier or {})
            twins = {t for sig, turns in sigs.items() if sig in seen for t in turns}
            self._store_rollouts(
                s,
                row,
                content,
                dumped,
                [_RolloutToStore(row.rollouts_received, rollout, plan, sigs, twins)],
            )
            submitted = Submitted(row.id, row.group_id, row.status, True)
        self._dispatch_queued([row.id])
        self._maybe_aggregate([row.id])
        return submitted, True

    def _store_rollouts(
        self, s: Session, group: m.Group, content: GroupContent, dumped: Dumped, items: Sequence[_RolloutToStore]
    ) -> None:
        """Store rollouts, their turns, deterministic zeros and work units with bulk inserts.

        A batch of groups carries thousands of turns of page text: one multi-row
        statement per table, not one ORM object per row, keeps ingest a fraction of a
        step's critical path.
        """
        if not items:
            return  # a streaming group opened with no rollout yet
        params = params_of(group)
        # The outcome half (SPEC section 11): what each report's reward reads, kept at ingest.
        judged = params.outcome_source == "judge"
        facts = {item.rollout.id: report_facts(item.rollout) for item in items} if judged else {}
        # Twins are known exactly when the whole group arrives at once.
        whole = judged and group.rollouts_received == 0 and len(items) == group.expected_rollouts
        outcome_twins = (
            twin_calls({i.rollout.id: call_signatures(i.rollout, facts[i.rollout.id], content.rubrics) for i in items})
            if whole
            else None
        )
        rollout_pks = {
            rollout_id: pk
            for pk, rollout_id in s.execute(
                insert(m.Rollout).returning(m.Rollout.id, m.Rollout.rollout_id),
                [
                    {
                        "group_pk": group.id,
                        "position": item.position,
                        "rollout_id": item.rollout.id,
                        "content_hash": dumped.rollout_hash(item.rollout.id),
                        "outcome_reward": item.rollout.outcome_reward,
                        "signatures": item.signatures,
                        "outline": outline_turns(dumped.rollouts[item.rollout.id]["turns"]),
                        "outcome_facts": facts[item.rollout.id].to_json() if facts else None,
                        "arrived_at": now(),
                    }
                    for item in items
                ],
            )
        }
        turns: list[tuple[int, int, str, dict[str, Any]]] = []
        judgments: list[dict[str, Any]] = []
        units: list[dict[str, Any]] = []
        skipped: list[tuple[int, str, int]] = []
        positive = content.positive_rubrics
        # Units are dispatched in id order: the rollout with the longest chains first.
        for item in sorted(items, key=lambda i: -_chain_length(i.rollout)):
            rollout, plan, twins = item.rollout, item.plan, item.twins
            rollout_pk = rollout_pks[rollout.id]
            turns.extend(
                (rollout_pk, i, body["type"], body) for i, body in enumerate(dumped.rollouts[rollout.id]["turns"])
            )
            judgments.extend(
                {
                    "group_pk": group.id,
                    "kind": "visit",
                    "rollout_id": rollout.id,
                    "turn_index": t,
                    "rubric_id": rubric.id,
                    "status": "deterministic",
                    "level": 0,
                    "cache_hit": False,
                    "attempt_count": 0,
                    "attempts": [],
                    "created_at": now(),
                }
                for t in plan.deterministic_zero_visits
                for rubric in positive
            )
            units.extend(
                {
                    "group_pk": group.id,
                    "kind": "visit_chain",
                    "unit_key": f"{rollout.id}\x1f{chain.rubric_id}",
                    "rollout_id": rollout.id,
                    "rubric_id": chain.rubric_id,
                    "turn_index": None,
                    "status": "queued",
                    "dedupe_turns": sorted(twins & set(chain.turn_indices)),
                    "payload": None,
                }
                for chain in plan.chains
            )
            known = {t: 0.0 for t in plan.deterministic_zero_visits}
            for task in plan.snippet_tasks:
                decision = snippet_decision(task, known, params)
                units.append(
                    {
                        "group_pk": group.id,
                        "kind": "snippet",
                        "unit_key": f"{rollout.id}\x1f{task.turn_index}",
                        "rollout_id": rollout.id,
                        "rubric_id": None,
                        "turn_index": task.turn_index,
                        "status": {"call": "queued", "wait": "waiting", "skip": "done"}[decision],
                        "dedupe_turns": [task.turn_index] if task.turn_index in twins else [],
                        "payload": [r.model_dump(mode="json") for r in task.eligible],
                    }
                )
                if decision == "skip":
                    skipped.append((group.id, rollout.id, task.turn_index))
            group.judgments_planned += sum(len(c.turn_indices) for c in plan.chains) + len(plan.snippet_tasks)
            outcome_calls = planned_calls(facts[rollout.id], content.rubrics) if judged else []
            if outcome_calls:
                # Calls that may have an identical twin go through the group-wide claim;
                # when the rollouts arrive one by one, any call may (the later ones are
                # not known yet).
                keyed = outcome_twins.get(rollout.id) if outcome_twins is not None else None
                units.append(
                    {
                        "group_pk": group.id,
                        "kind": "outcome",
                        "unit_key": f"{rollout.id}\x1foutcome",
                        "rollout_id": rollout.id,
                        "rubric_id": None,
                        "turn_index": None,
                        "status": "queued",
                        "dedupe_turns": keyed if keyed is not None else [f"{k}\x1f{c}" for k, c in outcome_calls],
                        "payload": None,
                    }
                )
                group.judgments_planned += len(outcome_calls)
        if turns:
            copy_rows(s, m.Turn.__table__, ("rollout_pk", "index", "type", "body"), turns)  # type: ignore[arg-type]
        if judgments:
            s.connection().execute(insert(m.Judgment), judgments)
            metrics.DETERMINISTIC_ZEROS.inc(len(judgments))
        self._add_skipped(s, skipped)
        if units:
            stamp = now()
            copy_rows(
                s,
                m.WorkUnit.__table__,  # type: ignore[arg-type]
                (*_UNIT_COLUMNS, "attempts", "updated_at"),
                [(*(u[c] for c in _UNIT_COLUMNS), 0, stamp) for u in units],
            )
        group.units_total += len(units)
        group.units_done += len(skipped)
        group.rollouts_received += len(items)

    def sweep(self, stale_after_s: float) -> int:
        """Re-dispatch work whose broker message may be lost; returns units re-dispatched.

        The database, not the broker, is the record of what is left to do. A unit queued
        longer than ``stale_after_s`` ago, or running under a lease that expired that long
        ago, is dispatched again (a conditional touch makes one sweeper win); a duplicate
        delivery finds the unit done or leased and does nothing. Groups whose units are
        all done but whose aggregation never ran are aggregated.
        """
        cutoff = now() - timedelta(seconds=stale_after_s)
        refs: list[UnitRef] = []
        with self.db.session() as s:
            open_groups = select(m.Group.id).where(m.Group.status.in_(("queued", "running")))
            candidates = s.execute(
                select(
                    m.WorkUnit.id,
                    m.WorkUnit.kind,
                    m.WorkUnit.group_pk,
                    m.WorkUnit.rollout_id,
                    m.WorkUnit.status,
                    m.WorkUnit.updated_at,
                ).where(
                    m.WorkUnit.group_pk.in_(open_groups),
                    ((m.WorkUnit.status == "queued") & (m.WorkUnit.updated_at <= cutoff))
                    | ((m.WorkUnit.status == "running") & (m.WorkUnit.lease_expires_at <= cutoff)),
                )
            ).all()
            for unit_id, kind, group_pk, rollout_id, status, updated in candidates:
                touched = _changed(
                    s,
                    update(m.WorkUnit)
                    .where(m.WorkUnit.id == unit_id, m.WorkUnit.status == status, m.WorkUnit.updated_at == updated)
                    .values(status="queued", lease_owner=None, lease_expires_at=None, updated_at=now()),
                )
                if touched:
                    refs.append(UnitRef(kind, unit_id, group_pk, rollout_id))  # type: ignore[arg-type]
            stuck = list(
                s.scalars(
                    select(m.Group.id).where(
                        m.Group.status.in_(("queued", "running")),
                        m.Group.aggregation == "enqueued",
                        m.Group.updated_at <= cutoff,
                    )
                )
            )
            for group_pk in sorted(stuck):
                _changed(
                    s,
                    update(m.Group)
                    .where(m.Group.id == group_pk, m.Group.aggregation == "enqueued")
                    .values(aggregation="pending", updated_at=now()),
                )
            waiting = s.execute(
                select(m.WorkUnit.group_pk, m.WorkUnit.rollout_id)
                .where(m.WorkUnit.group_pk.in_(open_groups), m.WorkUnit.status == "waiting")
                .distinct()
            ).all()
            pending = list(s.scalars(open_groups))
        if refs:
            log.warning("re-dispatching %d work units whose messages may be lost", len(refs))
            self.dispatcher.dispatch(refs)
        for group_pk, rollout_id in waiting:
            self._release_snippets(group_pk, rollout_id)
        self._maybe_aggregate(pending)
        return len(refs)

    # ================================================================== dispatch

    def _dispatch_queued(self, group_pks: Sequence[int]) -> int:
        """Send the queued units of these groups, group by group in the order given."""
        if not group_pks:
            return 0
        queued: dict[int, list[UnitRef]] = {pk: [] for pk in group_pks}
        with self.db.session() as s:
            for unit_id, kind, group_pk, rollout_id in s.execute(
                select(m.WorkUnit.id, m.WorkUnit.kind, m.WorkUnit.group_pk, m.WorkUnit.rollout_id)
                .where(m.WorkUnit.group_pk.in_(group_pks), m.WorkUnit.status == "queued")
                .order_by(m.WorkUnit.id)
            ):
                queued[group_pk].append(UnitRef(kind, unit_id, group_pk, rollout_id))  # type: ignore[arg-type]
        refs = [ref for pk in group_pks for ref in queued[pk]]
        self.dispatcher.dispatch(refs)
        return len(refs)

    def _maybe_aggregate(self, group_pks: Sequence[int]) -> None:
        """Enqueue the aggregation of those of these groups whose every unit is done."""
        if not group_pks:
            return
        with self.db.session() as s:
            flipped = repo.flip_aggregation(s, group_pks, now())
        for group_pk in flipped:
            self.dispatcher.dispatch_aggregation(group_pk)

    # ================================================================== units

    def submit_units(self, refs: Sequence[UnitRef]) -> Future[list[UnitOutcome]]:
        """Start units on the engine loop; the future holds one outcome per unit."""
        return self.engine.submit(self.arun_units(refs))

    def submit_aggregation(self, group_pk: int) -> Future[None]:
        return self.engine.submit(self.engine.db(self.run_aggregation, group_pk))

    def run_units(self, refs: Sequence[UnitRef]) -> list[UnitOutcome]:
        """Run units to completion from a thread outside the engine (a Celery task)."""
        return self.submit_units(refs).result()

    async def arun_units(self, refs: Sequence[UnitRef]) -> list[UnitOutcome]:
        """Run units concurrently to completion (or until their group fails); safe to deliver twice.

        Each outcome is ``done`` (finished now), ``noop`` (nothing left to do),
        ``stopped`` (the process is stopping; the unit stays resumable) or ``busy``
        (another delivery holds a live lease on it; try again after the lease time).
        The units are claimed in one transaction; an error of one unit is raised after
        the others have finished.
        """
        owner = f"{self.worker_id}:{uuid.uuid4().hex[:8]}"
        self.leases.ensure_heartbeat()
        claims = await self.engine.db(_retry_lock_conflicts, self._claim_units, refs, owner)
        outcomes = await asyncio.gather(
            *(self._arun_claimed(ref, claims[ref.unit_id], owner) for ref in refs), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes  # type: ignore[return-value]

    async def _arun_claimed(self, ref: UnitRef, claimed: Claimed | UnitOutcome, owner: str) -> UnitOutcome:
        if isinstance(claimed, str):
            metrics.UNITS.labels(ref.kind, claimed).inc()
            return claimed
        structlog.contextvars.bind_contextvars(group_pk=ref.group_pk, unit_id=ref.unit_id, unit_kind=ref.kind)
        try:
            return await self._arun_leased(ref, claimed, owner)
        finally:
            self.leases.dropped(ref.unit_id)

    async def _arun_leased(self, ref: UnitRef, claimed: Claimed, owner: str) -> UnitOutcome:
        try:
            if ref.kind == "visit_chain":
                metrics.CHAINS_IN_FLIGHT.inc()
                try:
                    outcome = await self._arun_visit_chain(claimed, owner)
                finally:
                    metrics.CHAINS_IN_FLIGHT.dec()
            elif ref.kind == "outcome":
                outcome = await run_outcome_unit(self, claimed, owner)
            else:
                outcome = await self._arun_snippet(claimed, owner)
        except _Stopping:
            await self.engine.db(self._release, ref.unit_id, owner)
            outcome = "stopped"
        except JudgeUnavailable as exc:
            # Past the outage deadline: the group fails with the reason, whatever the
            # failure policy (SPEC section 8: an outage is never scored).
            await self.engine.db(self.fail_group, ref.group_pk, str(exc))
            outcome = "noop"
        except Exception as exc:
            metrics.UNITS.labels(ref.kind, "error").inc()
            log.exception("unit %s %s of group %s failed", ref.kind, ref.unit_id, ref.group_pk)
            await self.engine.db(self._unit_error, ref, exc)
            raise
        metrics.UNITS.labels(ref.kind, outcome).inc()
        return outcome

    def _unit_error(self, ref: UnitRef, exc: Exception) -> None:
        try:
            with self.db.session() as s:
                unit = s.get(m.WorkUnit, ref.unit_id)
                if unit is None:
                    return
                unit.last_error = f"{type(exc).__name__}: {exc}"[:2000]
                unit.lease_owner, unit.lease_expires_at = None, None
                attempts = unit.attempts
        except Exception:  # noqa: BLE001 - the database itself may be what failed
            log.warning("could not record the error of unit %s", ref.unit_id)
            return
        if attempts >= MAX_UNIT_ATTEMPTS:
            self.fail_group(ref.group_pk, f"work unit {ref.kind} {ref.unit_id} failed {attempts} times: {exc}")

    def _claim_units(self, refs: Sequence[UnitRef], owner: str) -> dict[int, Claimed | UnitOutcome]:
        """Take the units' leases, count the delivery and read where each left off.

        A unit never delivered before has nothing stored, so only a redelivered one
        reads its stored judgments and support history.
        """
        out: dict[int, Claimed | UnitOutcome] = {r.unit_id: "noop" for r in refs}
        with self.db.session() as s:
            # A claim changes a group row only to start a queued group (its first claim):
            # only then does it lock the group rows, first and in id order as every
            # transaction does. Otherwise it waits on no batch write of those groups;
            # the units' own locks order it with a failing group's cancellation.
            group_pks = {r.group_pk for r in refs}
            groups = repo.group_states(s, group_pks)
            if any(status == "queued" for status, _ in groups.values()):
                groups = repo.group_states(s, group_pks, lock=True)
            units = repo.units_for_claim(s, [r.unit_id for r in refs])
            headless = {u.group_pk for u in units if u.payload is not None and u.group_pk not in self._headers}
            for pk, question, rubrics in repo.group_headers(s, headless):
                self._remember_header(pk, question, rubrics)
            stamp = now()
            taken = []
            for unit in units:
                group = groups.get(unit.group_pk)
                if unit.status in ("done", "cancelled", "waiting") or group is None:
                    continue  # a waiting snippet call is released by the visits it waits on
                if group[0] not in ("queued", "running"):
                    continue
                expires = _aware(unit.lease_expires_at) if unit.lease_expires_at else None
                if unit.status == "running" and unit.lease_owner and expires is not None and expires > stamp:
                    out[unit.id] = "busy"
                    continue
                taken.append(unit)
            if not taken:
                return out
            self.leases.taken([u.id for u in taken], owner)
            repo.start_units(s, [u.id for u in taken], owner, stamp + timedelta(seconds=self.lease_s), stamp)
            repo.start_groups(s, {u.group_pk for u in taken if groups[u.group_pk][0] == "queued"}, stamp)
            # Fresh units (no earlier delivery) have nothing stored to read.
            resumed = [u for u in taken if u.attempts > 0]
            done, history, snippets_done = (
                _stored_state(s, {u.group_pk for u in resumed}, {u.rollout_id for u in resumed})
                if resumed
                else ({}, {}, set())
            )
            for unit in taken:
                chain = (unit.group_pk, unit.rollout_id, unit.rubric_id or "")
                out[unit.id] = Claimed(
                    unit_id=unit.id,
                    group_pk=unit.group_pk,
                    rollout_id=unit.rollout_id,
                    rubric_id=unit.rubric_id or "",
                    turn_index=unit.turn_index or 0,
                    # Turn indices (visit and snippet units) or call keys (outcome units).
                    dedupe_turns=frozenset(x for x in unit.dedupe_turns or () if isinstance(x, int)),
                    twin_calls=frozenset(x for x in unit.dedupe_turns or () if isinstance(x, str)),
                    params=self._params(unit.group_pk, groups[unit.group_pk][1]),
                    done=frozenset(done.get(chain, ())),
                    history=tuple(history.get(chain, ())),
                    snippet_done=(unit.group_pk, unit.rollout_id, unit.turn_index or 0) in snippets_done,
                    payload=None
                    if unit.payload is None
                    else tuple(SearchResult.model_validate(r) for r in unit.payload),
                    resumed=unit.attempts > 0,
                )
        return out

    def _params(self, group_pk: int, stored: dict[str, Any]) -> ScoringParams:
        """A group's parameters, validated once per process (they never change)."""
        params = self._group_params.get(group_pk)
        if params is None:
            params = ScoringParams.model_validate(stored)
            self._group_params.put(group_pk, params)
        return params

    def _remember_header(self, group_pk: int, question: str, rubrics: Any) -> None:
        positive = tuple(r for r in parse_rubrics(rubrics) if r.positive)
        self._headers.put(group_pk, (question, positive))

    def _release(self, unit_id: int, owner: str) -> None:
        """Give the lease back so the next delivery can continue at once."""
        with self.db.session() as s:
            s.execute(
                update(m.WorkUnit)
                .where(m.WorkUnit.id == unit_id, m.WorkUnit.lease_owner == owner, m.WorkUnit.status == "running")
                .values(status="queued", lease_owner=None, lease_expires_at=None)
            )

    async def _acontent(self, group_pk: int, rollout_id: str) -> GroupContent:
        key = (group_pk, rollout_id)
        cached = self._content_cache.get(key)
        if cached is not None:
            return cached
        loading = self._content_loads.get(key)
        if loading is None:
            loading = asyncio.ensure_future(self.engine.db(self.rollout_content, group_pk, rollout_id))
            self._content_loads[key] = loading
            loading.add_done_callback(lambda _: self._content_loads.pop(key, None))
        # Shielded: one waiter's cancellation must not cancel the others' load.
        return await asyncio.shield(loading)

    def _plan(self, group_pk: int, content: GroupContent, rollout: Rollout, params: ScoringParams) -> RolloutPlan:
        """A rollout's plan, computed once per process for all its units."""
        key = (group_pk, rollout.id)
        plan = self._plans.get(key)
        if plan is None:
            plan = plan_rollout(content, rollout, params)
            self._plans.put(key, plan)
        return plan

    async def _arun_visit_chain(self, unit: Claimed, owner: str) -> UnitOutcome:
        group_pk, params = unit.group_pk, unit.params
        content = await self._acontent(group_pk, unit.rollout_id)
        rollout = content.rollout(unit.rollout_id)
        rubric = _rubric(content, unit.rubric_id)
        plan = self._plan(group_pk, content, rollout, params)
        chain = next(c for c in plan.chains if c.rubric_id == rubric.id)
        # Visits whose credit decides a waiting snippet call: after judging one of them
        # the snippet calls of the rollout are reconsidered.
        deciders = (
            {v for task in plan.snippet_tasks for v in task.navigation_visits}
            if params.skip_saturated_snippets
            else set()
        )
        done, history = set(unit.done), list(unit.history)
        slots = self.engine.judge_slots
        # The store of the previous answer runs while the next call is made (its answer
        # is all the next request needs); its outcome is read before the next store, so
        # a chain's judgments still go in one at a time and in order. Until stored, an
        # answer keeps its judge slot: a worker that dies loses at most its judge
        # concurrency in answers, as when the store was awaited first.
        pending: asyncio.Task[StoreOutcome] | None = None
        pending_finishes = False
        while True:
            t = next((u for u in chain.turn_indices if u not in done), None)
            if t is None or self._stopping.is_set():
                outcome: StoreOutcome = "stored"
                if pending is not None:
                    outcome, pending = await pending, None
                if outcome == "lost":
                    return "noop"  # the group failed, or another delivery took the unit over
                if outcome == "duplicate":
                    done, history = await self.engine.db(self._chain_state, group_pk, rollout.id, rubric.id)
                    pending_finishes = False
                    continue
                if t is not None:
                    raise _Stopping()
                if not pending_finishes:
                    await self._writer.put(Write(finish=(unit.unit_id, group_pk)))
                return "done"
            # Calls this chain still has to make, this one included: its claim on a slot.
            remaining = sum(1 for u in chain.turn_indices if u >= t and u not in done)
            turn = rollout.turns[t]
            assert isinstance(turn, VisitTurn)
            request = VisitJudgeRequest(
                question=content.question,
                rubric=rubric,
                prior_support=tuple(history) if params.history else (),
                turn=turn,
            )
            prompt = self.judge.visit_prompt(request)
            # The request's key finds an identical request's answer: only a turn that can
            # have a twin needs one (hashing a prompt with pages costs a judge call's CPU).
            key = prompt.cache_key(self.judge.model) if t in unit.dedupe_turns else None
            release = None
            if t in deciders and (group_pk, rollout.id) not in self._no_waiting:
                release = ((group_pk, rollout.id), params)
            # The chain's last judgment finishes the unit in the same transaction (not
            # under the fail policy: a failed judgment must fail the group first).
            last = t == chain.turn_indices[-1] and params.on_judge_failure != "fail"
            store = functools.partial(
                self._store_visit,
                group_pk,
                rollout.id,
                rubric.id,
                t,
                len(history),
                key,
                (unit.unit_id, owner),
                release,
                (unit.unit_id, group_pk) if last else None,
            )
            call = functools.partial(self.judge.ajudge_visit, request, prompt)
            stored: StoreOutcome
            if key is not None:
                # A request that may have a twin is judged and stored in one step, after
                # the previous store (its answer may be shared with another chain).
                if pending is not None:
                    outcome, pending = await pending, None
                    if outcome == "lost":
                        return "noop"
                    if outcome == "duplicate":
                        done, history = await self.engine.db(self._chain_state, group_pk, rollout.id, rubric.id)
                        continue
                async with slots.slot(remaining):
                    result, stored = await self._judge_once(group_pk, key, "visit", call, store)
                pending_finishes = last and stored == "stored"
            else:
                await slots.acquire(remaining)
                try:
                    result = await self._call_judge(group_pk, call)
                    previous: StoreOutcome = "stored"
                    if pending is not None:
                        previous, pending = await pending, None
                except BaseException:
                    slots.release()
                    raise
                if previous != "stored":
                    slots.release()  # this answer was asked on a history that was not ours
                    if previous == "lost":
                        return "noop"
                    done, history = await self.engine.db(self._chain_state, group_pk, rollout.id, rubric.id)
                    pending_finishes = False
                    continue
                if result.status == "failed" and params.on_judge_failure == "fail":
                    try:
                        stored = await store(result, False)
                    finally:
                        slots.release()
                else:
                    pending = asyncio.ensure_future(store(result, False))
                    pending.add_done_callback(_release_slot(slots))
                    pending_finishes = last
                    stored = "stored"  # read before the next store (see above)
            if stored == "duplicate":
                done, history = await self.engine.db(self._chain_state, group_pk, rollout.id, rubric.id)
                continue
            if stored == "lost":
                return "noop"
            if result.status == "ok" and result.verdict is not None and result.verdict.level > 0:
                history.extend(result.verdict.support_points)
            if result.status == "failed" and params.on_judge_failure == "fail":
                await self.engine.db(
                    self.fail_group,
                    group_pk,
                    f"visit judgment failed (rollout {rollout.id}, turn {t}, rubric {rubric.id}): {result.failure_reason}",
                )
                return "noop"
            done.add(t)

    async def _arun_snippet(self, unit: Claimed, owner: str) -> UnitOutcome:
        group_pk, params = unit.group_pk, unit.params
        if not unit.snippet_done:
            request = await self._snippet_request(unit)
            prompt = self.judge.snippet_prompt(request)
            key = prompt.cache_key(self.judge.model) if unit.dedupe_turns else None
            call = functools.partial(self.judge.ajudge_snippets, request, prompt)
            # Unless the group fails on this judgment, storing it finishes the unit.
            fails_group = params.on_judge_failure == "fail"
            store = functools.partial(
                self._store_snippet,
                group_pk,
                unit.rollout_id,
                unit.turn_index,
                key,
                None if fails_group else (unit.unit_id, group_pk),
            )
            async with self.engine.judge_slots.slot(1):
                if key is not None:
                    result, stored = await self._judge_once(group_pk, key, "snippet", call, store)
                else:
                    result = await self._call_judge(group_pk, call)
                    stored = await store(result, False)
            if result.status == "failed" and fails_group:
                await self.engine.db(
                    self.fail_group,
                    group_pk,
                    f"snippet judgment failed (rollout {unit.rollout_id}, turn {unit.turn_index}): {result.failure_reason}",
                )
                return "noop"
            if stored == "stored" and not fails_group:
                return "done"
        await self._writer.put(Write(finish=(unit.unit_id, group_pk)))
        return "done"

    async def _snippet_request(self, unit: Claimed) -> SnippetJudgeRequest:
        """From the unit's stored results and the group's header; the rollout only for a
        unit stored before snippet calls carried their results."""
        header = self._headers.get(unit.group_pk)
        if unit.payload is not None and header is not None:
            question, rubrics = header
            return SnippetJudgeRequest(question, rubrics, unit.payload)
        content = await self._acontent(unit.group_pk, unit.rollout_id)
        rollout = content.rollout(unit.rollout_id)
        plan = self._plan(unit.group_pk, content, rollout, unit.params)
        task = next(t for t in plan.snippet_tasks if t.turn_index == unit.turn_index)
        return SnippetJudgeRequest(content.question, tuple(content.positive_rubrics), task.eligible)

    # ------------------------------------------------------------------ judging

    async def _call_judge(self, group_pk: int, call: Callable[[], Awaitable[JudgeResult[R]]]) -> JudgeResult[R]:
        """One judgment (with its retries, and its waits for an unreachable judge); the
        caller holds a judge slot.

        A slot covers the call *and* the store of its answer, so the judge answers a
        process could lose when it dies are at most its judge concurrency.
        """
        with self.outages.judging(group_pk):
            result = await call()
        _observe(result)
        return result

    async def _judge_once(
        self,
        group_pk: int,
        key: str,
        kind: str,
        call: Callable[[], Awaitable[JudgeResult[R]]],
        store: Callable[[JudgeResult[R], bool], Awaitable[S]],
    ) -> tuple[JudgeResult[R], S]:
        """Judge a request once per group and store the result with ``store``.

        An identical request already answered in the group is reused (a cache hit). One in
        flight in this process is awaited in memory; with ``claims`` on (distributed mode)
        one in flight in another process is awaited through a claim row, which expires
        with the lease if its owner dies. Returns (result, stored).
        """
        hit = await self.engine.db(self._stored_answer, group_pk, key, kind)
        if hit is not None:
            return hit, await store(hit, True)
        slot = (group_pk, key)
        pending = self._inflight.get(slot)
        if pending is not None:
            result = await asyncio.shield(pending)
            metrics.JUDGE_CACHE_HITS.labels(kind).inc()
            return result, await store(result, True)
        future: asyncio.Future[JudgeResult[Any]] = asyncio.get_running_loop().create_future()
        self._inflight[slot] = future
        token = None
        try:
            if self.claims:
                token, hit = await self._await_claim(group_pk, key, kind)
                if hit is not None:
                    future.set_result(hit)
                    return hit, await store(hit, True)
            result = await self._call_judge(group_pk, call)
            stored = await store(result, False)
            future.set_result(result)
            return result, stored
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: waiters see it, nobody else must
            raise
        finally:
            self._inflight.pop(slot, None)
            if token is not None:
                await self.engine.db(self._drop_claim, group_pk, key, token)

    def _stored_answer(self, group_pk: int, key: str, kind: str) -> JudgeResult[Any] | None:
        with self.db.session() as s:
            row = s.scalars(
                select(m.Judgment)
                .where(
                    m.Judgment.group_pk == group_pk,
                    m.Judgment.request_key == key,
                    m.Judgment.status == "ok",
                    m.Judgment.cache_hit.is_(False),
                )
                .limit(1)
            ).first()
            if row is None:
                return None
            metrics.JUDGE_CACHE_HITS.labels(kind).inc()
            return _result_from_row(row)

    async def _await_claim(self, group_pk: int, key: str, kind: str) -> tuple[str | None, JudgeResult[Any] | None]:
        """Claim the request for this process, or wait for its owner's stored answer."""
        token = f"{self.worker_id}:{uuid.uuid4().hex[:8]}"
        pause = 0.05
        while True:
            outcome = await self.engine.db(self._try_claim, group_pk, key, kind, token)
            if outcome is not None:
                return outcome
            if self._stopping.is_set():
                raise _Stopping()
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, 0.5)

    def _try_claim(
        self, group_pk: int, key: str, kind: str, token: str
    ) -> tuple[str | None, JudgeResult[Any] | None] | None:
        try:
            with self.db.session() as s:
                s.add(m.RequestClaim(group_pk=group_pk, request_key=key, owner=token, claimed_at=now()))
        except IntegrityError:
            pass
        else:
            # The owner this delivery waited on stores its answer before letting go of
            # its claim: a claim won just after it must take that answer, not ask again.
            hit = self._stored_answer(group_pk, key, kind)
            if hit is None:
                return token, None
            self._drop_claim(group_pk, key, token)
            return None, hit
        hit = self._stored_answer(group_pk, key, kind)
        if hit is not None:
            return None, hit
        with self.db.session() as s:
            stale = now() - timedelta(seconds=self.lease_s)
            stolen = _changed(
                s,
                update(m.RequestClaim)
                .where(
                    m.RequestClaim.group_pk == group_pk,
                    m.RequestClaim.request_key == key,
                    m.RequestClaim.claimed_at < stale,
                )
                .values(owner=token, claimed_at=now()),
            )
        return (token, None) if stolen else None

    def _drop_claim(self, group_pk: int, key: str, token: str) -> None:
        try:
            with self.db.session() as s:
                s.execute(
                    delete(m.RequestClaim).where(
                        m.RequestClaim.group_pk == group_pk,
                        m.RequestClaim.request_key == key,
                        m.RequestClaim.owner == token,
                    )
                )
        except Exception:
            log.warning("could not drop the claim on a judge request", exc_info=True)

    def _chain_state(self, group_pk: int, rollout_id: str, rubric_id: str) -> tuple[set[int], list[str]]:
        with self.db.session() as s:
            done, history, _ = _stored_state(s, {group_pk}, {rollout_id})
        chain = (group_pk, rollout_id, rubric_id)
        return set(done.get(chain, ())), list(history.get(chain, ()))

    async def _store_visit(
        self,
        group_pk: int,
        rollout_id: str,
        rubric_id: str,
        turn_index: int,
        prior: int,
        key: str | None,
        lease: tuple[int, str],
        release: tuple[tuple[int, str], ScoringParams] | None,
        finish: tuple[int, int] | None,
        result: JudgeResult[VisitVerdict],
        cached: bool,
    ) -> StoreOutcome:
        """Store one judgment (which extends its rubric's history) and renew the unit's lease, atomically.

        ``duplicate``: another delivery stored this judgment first. ``lost``: stored, but
        the unit is no longer this delivery's (its group failed, or its lease passed on).
        """
        verdict = result.verdict
        values = judgment_values(group_pk, "visit", rollout_id, turn_index, rubric_id, key, result, cached)
        values["prior_support"] = prior
        if verdict is not None:
            values.update(
                level=verdict.level,
                page_ids=list(verdict.page_ids),
                support_points=list(verdict.support_points),
                rationale=verdict.rationale,
            )
        return await self._writer.put(Write(JudgmentRow(values), lease, finish=finish, release=release))

    async def _store_snippet(
        self,
        group_pk: int,
        rollout_id: str,
        turn_index: int,
        key: str | None,
        finish: tuple[int, int] | None,
        result: JudgeResult[SnippetVerdict],
        cached: bool,
    ) -> StoreOutcome:
        values = judgment_values(group_pk, "snippet", rollout_id, turn_index, "", key, result, cached)
        verdict = result.verdict
        if verdict is not None:
            values.update(
                matches=[vars(x) for x in verdict.accepted],
                rejected_matches=[{"index": x.index, "match": x.raw, "reason": x.reason} for x in verdict.rejected],
                match_count=len(verdict.accepted),
            )
        return await self._writer.put(Write(JudgmentRow(values), finish=finish))

    def _write_batch(self, writes: Sequence[Write]) -> list[StoreOutcome]:
        """:meth:`_write_batch_once`, run again when the server aborted it to break a
        deadlock, and kept until the database is back when it is away.

        Judge answers are the expensive part: an outage of the database must not make
        the platform ask them again. A batch that failed to commit is written again as
        a whole; one whose commit went through unacknowledged finds its judgments
        stored (``duplicate``) and its chains read where they stand.
        """
        deadline = time.monotonic() + self.store_patience_s
        pause = 0.25
        while True:
            try:
                return _retry_lock_conflicts(self._write_batch_once, writes)
            except Exception as exc:
                if not is_connection_error(exc) or time.monotonic() + pause > deadline or self._stopping.is_set():
                    raise
                log.warning("database unavailable; keeping %d judge answers and trying again", len(writes))
                time.sleep(pause)
                pause = min(pause * 2, 5.0)

    def _write_batch_once(self, writes: Sequence[Write]) -> list[StoreOutcome]:
        """Store judgments, renew leases and finish units, for many chains in one transaction.

        A judgment another delivery already stored is reported ``duplicate`` without
        failing the rest of the batch (:func:`drcredit.storage.bulk.store_judgments`).
        """
        outcomes: list[StoreOutcome] = ["stored"] * len(writes)
        flipped: list[int] = []
        with self.db.session() as s:
            judged = [(i, w) for i, w in enumerate(writes) if w.judgment is not None]
            if judged:
                stored = store_judgments(s, [w.judgment for _, w in judged])  # type: ignore[misc]
                leases = [w.lease for n, (_, w) in enumerate(judged) if n in stored and w.lease is not None]
                kept = self.leases.keep(s, leases)
                for n, (i, w) in enumerate(judged):
                    if n not in stored:
                        outcomes[i] = "duplicate"
                    elif w.lease is not None and w.lease[0] not in kept:
                        outcomes[i] = "lost"
            # Group rows are locked (in id order, as in every transaction that locks
            # them) only now, for the short rest of the transaction. The lock also orders
            # concurrent batches of a group: a release decided after it reads every
            # judgment committed before, so no waiting snippet call is left behind.
            repo.lock_groups(
                s, {w.finish[1] for w in writes if w.finish} | {w.release[0][0] for w in writes if w.release}
            )
            stamp = now()
            releases = dict(w.release for w in writes if w.release is not None)
            to_dispatch, done_by_skip = self._release_waiting(s, releases, stamp) if releases else ([], Counter())
            # A unit finishes with its last judgment only if that judgment is ours and stored.
            finishing = [w.finish[0] for i, w in enumerate(writes) if w.finish is not None and outcomes[i] == "stored"]
            done = Counter(repo.finish_units(s, finishing, stamp)) + done_by_skip
            repo.add_units_done(s, done, stamp)
            flipped = repo.flip_aggregation(s, set(done), stamp)
        if to_dispatch:
            self.dispatcher.dispatch(to_dispatch)
        for group_pk in flipped:
            self.dispatcher.dispatch_aggregation(group_pk)
        return outcomes

    # ------------------------------------------------------------------ snippets waiting on visits

    def _release_snippets(self, group_pk: int, rollout_id: str) -> None:
        """Decide the waiting snippet calls of a rollout whose navigation credit may now be known."""
        if (group_pk, rollout_id) in self._no_waiting:
            return
        with self.db.session() as s:
            stamp = now()
            repo.lock_groups(s, {group_pk})
            to_dispatch, done = self._release_waiting(s, {(group_pk, rollout_id): None}, stamp)
            repo.add_units_done(s, done, stamp)
            flipped = repo.flip_aggregation(s, set(done), stamp)
        if to_dispatch:
            self.dispatcher.dispatch(to_dispatch)
        for pk in flipped:
            self.dispatcher.dispatch_aggregation(pk)

    def _release_waiting(
        self, s: Session, rollouts: Mapping[tuple[int, str], ScoringParams | None], stamp: datetime
    ) -> tuple[list[UnitRef], Counter[int]]:
        """Queue or skip, in ``s``, the waiting snippet calls whose navigation visits are all judged.

        ``rollouts`` maps (group, rollout) to the group's params when the caller knows
        them (a chain does), else None. Returns the units to dispatch after commit and
        the units finished by a skip, per group (their counts are the caller's to add).
        """
        pairs = [p for p in rollouts if p not in self._no_waiting]
        if not pairs:
            return [], Counter()
        waiting: dict[tuple[int, str], list[tuple[int, int]]] = {}
        for unit_id, group_pk, rollout_id, turn_index in repo.waiting_snippets(s, pairs):
            waiting.setdefault((group_pk, rollout_id), []).append((unit_id, turn_index))
        for pair in pairs:
            if pair not in waiting:
                # Units never return to waiting: this rollout needs no check again.
                if len(self._no_waiting) > 100_000:
                    self._no_waiting.clear()
                self._no_waiting.add(pair)
        if not waiting:
            return [], Counter()
        levels: dict[tuple[int, str], dict[int, list[int]]] = {}
        for group_pk, rollout_id, turn_index, level in repo.visit_levels(s, waiting):
            levels.setdefault((group_pk, rollout_id), {}).setdefault(turn_index, []).append(level or 0)
        targets: dict[int, str] = {}
        units_of: dict[int, tuple[int, str, int]] = {}
        for (group_pk, rollout_id), units in waiting.items():
            known_params = rollouts[(group_pk, rollout_id)]
            params = (
                known_params
                if known_params is not None
                else self._params(group_pk, repo.group_states(s, {group_pk})[group_pk][1])
            )
            content = self.rollout_content(group_pk, rollout_id, session=s)
            rollout = content.rollout(rollout_id)
            plan = self._plan(group_pk, content, rollout, params)
            n_rubrics = len(content.positive_rubrics)
            known = {
                t: visit_credit(v, params)[0]
                for t, v in levels.get((group_pk, rollout_id), {}).items()
                if len(v) == n_rubrics
            }
            tasks = {t.turn_index: t for t in plan.snippet_tasks}
            for unit_id, turn_index in units:
                decision = snippet_decision(tasks[turn_index], known, params)
                if decision != "wait":
                    targets[unit_id] = "queued" if decision == "call" else "done"
                    units_of[unit_id] = (group_pk, rollout_id, turn_index)
        moved = repo.release_waiting(s, targets, stamp)
        to_dispatch = [
            UnitRef("snippet", u, units_of[u][0], units_of[u][1]) for u in sorted(moved) if targets[u] == "queued"
        ]
        skipped = [units_of[u] for u in sorted(moved) if targets[u] == "done"]
        self._add_skipped(s, skipped)
        return to_dispatch, Counter(group_pk for group_pk, _, _ in skipped)

    @staticmethod
    def _add_skipped(s: Session, skipped: Sequence[tuple[int, str, int]]) -> None:
        """Record (group, rollout, search turn) snippet calls skipped as saturated (SPEC section 4)."""
        if not skipped:
            return
        stamp = now()
        store_judgments(
            s,
            [
                JudgmentRow(
                    {
                        "group_pk": group_pk,
                        "kind": "snippet",
                        "rollout_id": rollout_id,
                        "turn_index": turn_index,
                        "rubric_id": "",
                        "status": "skipped",
                        "cache_hit": False,
                        "attempt_count": 0,
                        "attempts": [],
                        "created_at": stamp,
                    }
                )
                for group_pk, rollout_id, turn_index in skipped
            ],
        )
        metrics.SNIPPET_SKIPS.inc(len(skipped))

    # ================================================================== aggregation

    def run_aggregation(self, group_pk: int) -> None:
        """Compute and store credits and advantages once every judgment is in."""
        with self.db.session() as s:
            # The row lock serializes duplicate deliveries; the second finds it done.
            group = repo.group_for_aggregation(s, group_pk)
            if group is None or group.status not in ("queued", "running") or group.aggregation == "done":
                return
            params = self._params(group_pk, group.params)
            # Outlines, not turn bodies: credits read the rollouts' shape only.
            outlined = outlined_rollouts(s, group_pk)
            breakdowns = (
                group_breakdowns(s, group_pk, parse_rubrics(group.rubrics), params)
                if params.outcome_source == "judge"
                else {}
            )
            for _, doc in outlined:
                if doc["id"] in breakdowns:
                    doc["outcome_reward"] = breakdowns[doc["id"]].reward
            content = GroupContent.model_validate(
                {"question": group.question, "rubrics": group.rubrics, "rollouts": [doc for _, doc in outlined]}
            )
            judgments = judgments_of(s, group_pk)
            stamp = now()
            try:
                credits = group_credits(content, judgments, params)
                advantages = group_advantages(content, credits, params)
            except Exception as exc:
                log.exception("aggregation of group %s failed", group_pk)
                repo.finish_group(s, group_pk, None, f"aggregation failed: {type(exc).__name__}: {exc}", stamp)
                failed = True
            else:
                failed = False
                rollout_pks = {doc["id"]: pk for pk, doc in outlined}
                turn_pks = repo.turn_ids(s, rollout_pks.values())
                repo.store_results(s, *_result_rows(rollout_pks, turn_pks, credits, advantages))
                for rollout_id, breakdown in breakdowns.items():
                    s.execute(
                        update(m.Rollout)
                        .where(m.Rollout.id == rollout_pks[rollout_id])
                        .values(outcome_reward=breakdown.reward, outcome=breakdown_json(breakdown))
                    )
                st = advantages.stats
                stats = {
                    "mu_rg": st.mu_rg,
                    "sigma_rg": st.sigma_rg,
                    "mu_o": st.mu_o,
                    "sigma_o": st.sigma_o,
                    "research_turns": st.research_turns,
                    "unscorable_turns": st.unscorable_turns,
                }
                repo.finish_group(s, group_pk, stats, None, stamp)
            announce_final(s, group_pk)
        self.events.finished([group_pk])
        metrics.GROUPS_FINISHED.labels("failed" if failed else "done").inc()
        if not failed:
            metrics.GROUP_LATENCY.observe((stamp - _aware(group.created_at)).total_seconds())
            log.info("group done", extra={"group_pk": group_pk})

    def fail_group(self, group_pk: int, reason: str) -> None:
        with self.db.session() as s:
            changed = _changed(
                s,
                update(m.Group)
                .where(m.Group.id == group_pk, m.Group.status.in_(("queued", "running")))
                .values(status="failed", error=reason, finished_at=now()),
            )
            if changed:
                s.execute(
                    update(m.WorkUnit)
                    .where(m.WorkUnit.group_pk == group_pk, m.WorkUnit.status.in_(("queued", "running", "waiting")))
                    .values(status="cancelled", lease_owner=None, lease_expires_at=None)
                )
                announce_final(s, group_pk)
        if changed:
            self.events.finished([group_pk])
            metrics.GROUPS_FINISHED.labels("failed").inc()
            log.warning("group failed: %s", reason, extra={"group_pk": group_pk})

    # ================================================================== helpers

    def rollout_content(self, group_pk: int, rollout_id: str, session: Session | None = None) -> GroupContent:
        """The group's question and rubrics with one rollout: all that rollout's units read.

        Cached per (group, rollout) for the process; a rollout never changes once stored.
        ``session``: read in the caller's transaction (a writer holding SQLite's write
        lock must not wait on a second connection of its own).
        """
        key = (group_pk, rollout_id)
        cached = self._content_cache.get(key)
        if cached is not None:
            return cached
        with nullcontext(session) if session is not None else self.db.session() as s:
            document = repo.rollout_document(s, group_pk, rollout_id)
        if document is None:
            raise NotFound(f"rollout {rollout_id!r} of group {group_pk} not found")
        content = GroupContent.model_validate(document)
        self._content_cache.put(key, content)
        return content


def _result_rows(
    rollout_pks: dict[str, int],
    turn_pks: dict[int, list[int]],
    credits: list[RolloutCredits],
    advantages: GroupAdvantages,
) -> tuple[list[tuple[int, tuple[Any, ...]]], list[tuple[int, float]]]:
    """Aggregation's results as rows for :func:`drcredit.storage.repository.store_results`."""
    turn_rows: list[tuple[int, tuple[Any, ...]]] = []
    rollout_rows: list[tuple[int, float]] = []
    for rc, ra in zip(credits, advantages.rollouts, strict=True):
        rollout_pk = rollout_pks[rc.rollout_id]
        rollout_rows.append((rollout_pk, ra.outcome_advantage))
        for turn_pk, tc, ta in zip(turn_pks.get(rollout_pk, []), rc.turns, ra.turns, strict=True):
            values = (
                ta.credit,
                tc.visit_credit,
                tc.visit_credit_uncapped,
                tc.navigation_credit,
                tc.snippet_credit,
                tc.snippet_matches,
                ta.process_advantage,
                ta.discounted_process_advantage,
                ta.advantage,
                ta.unscorable,
            )
            turn_rows.append((turn_pk, values))
    return turn_rows, rollout_rows


def _retry_lock_conflicts(transaction: Callable[..., S], *args: Any) -> S:
    """Run a transaction again when the server aborted it to break a deadlock (nothing
    of it was committed)."""
    for attempt in Retrying(
        stop=stop_after_attempt(8),
        wait=wait_random(0.005, 0.05),
        retry=retry_if_exception(is_lock_conflict),
        reraise=True,
    ):
        with attempt:
            return transaction(*args)
    raise AssertionError("unreachable")  # pragma: no cover


def judgments_of(s: Session, group_pk: int) -> Judgments:
    """The stored ordinal judgments of a group, as the credit math reads them."""
    visit: dict[tuple[str, int, str], int] = {}
    snippet: dict[tuple[str, int], int] = {}
    failed_visits: set[tuple[str, int, str]] = set()
    failed_snippets: set[tuple[str, int]] = set()
    for kind, rollout_id, turn_index, rubric_id, status, level, count in repo.judgment_outcomes(s, group_pk):
        if kind == "visit":
            visit[(rollout_id, turn_index, rubric_id)] = (level or 0) if status in ("ok", "deterministic") else 0
            if status == "failed":
                failed_visits.add((rollout_id, turn_index, rubric_id))
        elif kind == "snippet" and status in ("ok", "failed"):
            snippet[(rollout_id, turn_index)] = (count or 0) if status == "ok" else 0
            if status == "failed":
                failed_snippets.add((rollout_id, turn_index))
    return Judgments(visit, snippet, frozenset(failed_visits), frozenset(failed_snippets))


def _rubric(content: GroupContent, rubric_id: str) -> Rubric:
    for rubric in content.rubrics:
        if rubric.id == rubric_id:
            return rubric
    raise KeyError(rubric_id)


def _chain_length(rollout: Rollout) -> int:
    """Judge calls of the rollout's visit chains: its visits with a usable page (the others
    are deterministic zeros, no call)."""
    return sum(1 for t in rollout.turns if isinstance(t, VisitTurn) and t.usable_pages)


def _longest_chain(group: GroupIn) -> int:
    """The length of the group's longest visit chain (see :func:`_chain_length`)."""
    return max((_chain_length(r) for r in group.rollouts), default=0)


def _stored_state(
    s: Session, group_pks: set[int], rollout_ids: set[str]
) -> tuple[dict[tuple[int, str, str], set[int]], dict[tuple[int, str, str], list[str]], set[tuple[int, str, int]]]:
    """Where the units of these rollouts left off: per (group, rollout, rubric) chain the
    visit turns judged and the support history in order; the snippet turns judged."""
    done: dict[tuple[int, str, str], set[int]] = {}
    snippets_done: set[tuple[int, str, int]] = set()
    for group_pk, kind, rollout_id, turn_index, rubric_id in s.execute(
        select(
            m.Judgment.group_pk, m.Judgment.kind, m.Judgment.rollout_id, m.Judgment.turn_index, m.Judgment.rubric_id
        ).where(m.Judgment.group_pk.in_(group_pks), m.Judgment.rollout_id.in_(rollout_ids))
    ):
        if kind == "visit":
            done.setdefault((group_pk, rollout_id, rubric_id), set()).add(turn_index)
        elif kind == "snippet":
            snippets_done.add((group_pk, rollout_id, turn_index))
    history = {
        chain: [text for _, text in points] for chain, points in support_histories(s, group_pks, rollout_ids).items()
    }
    return done, history, snippets_done


def _result_from_row(row: m.Judgment) -> JudgeResult[Any]:
    verdict: Any
    if row.kind == "visit":
        verdict = VisitVerdict(
            row.level or 0, tuple(row.page_ids or ()), tuple(row.support_points or ()), row.rationale or ""
        )
    elif row.kind in OUTCOME_KINDS:
        verdict = ScoreVerdict(row.level or 0, row.rationale or "")
    else:
        verdict = SnippetVerdict(
            tuple(SnippetMatch(**x) for x in row.matches or ()),
            tuple(RejectedMatch(x["index"], x["match"], x["reason"]) for x in row.rejected_matches or ()),
        )
    return JudgeResult(row.kind, "ok", row.model or "", row.backend or "", verdict, row.answer)  # type: ignore[arg-type]


def _observe(result: JudgeResult[Any]) -> None:
    metrics.observe_judgment(
        result.backend,
        result.kind,
        result.status,
        result.latency_s,
        result.prompt_tokens,
        result.completion_tokens,
        (a.outcome for a in result.attempts),
    )


#: The columns of a new work unit that ingest fills (the rest start empty).
_UNIT_COLUMNS = (
    "group_pk",
    "kind",
    "unit_key",
    "rollout_id",
    "rubric_id",
    "turn_index",
    "status",
    "dedupe_turns",
    "payload",
)


def _release_slot(slots: PrioritySlots) -> Callable[[asyncio.Future[Any]], None]:
    """Done-callback of a pipelined store: give its judge slot back and log a failure
    (the chain that started it may already have ended with another error)."""

    def done(task: asyncio.Future[Any]) -> None:
        slots.release()
        if not task.cancelled() and task.exception() is not None:
            log.warning("storing a judgment failed", exc_info=task.exception())

    return done


def _changed(s: Session, statement: Any) -> int:
    """Rows an UPDATE changed: conditional updates are how units claim transitions."""
    return s.connection().execute(statement).rowcount


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _reward_error(message: str) -> Exception:
    from drcredit.domain.errors import FieldError, InvalidInput

    return InvalidInput([FieldError("outcome_reward", message)])
