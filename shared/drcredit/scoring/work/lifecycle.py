"""The life of a work unit: dispatched, claimed under a lease, run, finished or given back.

A unit is a row in ``work_units``; the broker only carries references to it. A delivery
claims its units in one transaction (a live lease held by another delivery answers
``busy``; a done, cancelled or waiting unit ``noop``), reads where a redelivered unit
left off, runs each unit's kind (:mod:`drcredit.scoring.work.unit_kinds`) on the engine loop,
and keeps their leases alive (:mod:`drcredit.scoring.work.leases`). A unit finishes in the
transaction that stores its last judgment (:mod:`drcredit.scoring.work.writes`); a process
that stops gives its leases back, and one that dies leaves them to expire for the
sweeper (:mod:`drcredit.scoring.work.recovery`). A unit that errs ``MAX_UNIT_ATTEMPTS``
times fails its group.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from datetime import timedelta

import structlog
from sqlalchemy import select, update

from drcredit import metrics
from drcredit.domain.group import SearchResult
from drcredit.judges.breaker import JudgeUnavailable
from drcredit.scoring.dispatch import Dispatcher, UnitRef
from drcredit.scoring.results.outcomes import stored_facts
from drcredit.scoring.work.leases import LeaseKeeper
from drcredit.scoring.work.unit_context import UnitContext
from drcredit.scoring.work.unit_kinds import UNIT_KINDS
from drcredit.scoring.work.units import Claimed, Stopping, UnitOutcome
from drcredit.scoring.work.visit_chain import stored_state
from drcredit.storage import models as m
from drcredit.storage import repository as repo
from drcredit.storage.database import Database, aware, retry_lock_conflicts, utcnow
from drcredit.tenancy.owner import CALL_OWNER, Owner

log = logging.getLogger("drcredit.lifecycle")

#: Deliveries of one unit before its group is failed instead of retried again.
MAX_UNIT_ATTEMPTS = 5


class UnitLifecycle:
    """Claims, runs and releases the units of one delivery."""

    def __init__(self, ctx: UnitContext, leases: LeaseKeeper, *, worker_id: str, lease_s: float):
        self.ctx = ctx
        self.db = ctx.db
        self.leases = leases
        self.worker_id = worker_id
        self.lease_s = lease_s

    async def run(self, refs: Sequence[UnitRef]) -> list[UnitOutcome]:
        """Run units concurrently to completion (or until their group fails); safe to deliver twice.

        Each outcome is ``done`` (finished now), ``noop`` (nothing left to do),
        ``stopped`` (the process is stopping; the unit stays resumable) or ``busy``
        (another delivery holds a live lease on it; try again after the lease time).
        The units are claimed in one transaction; an error of one unit is raised after
        the others have finished.
        """
        owner = f"{self.worker_id}:{uuid.uuid4().hex[:8]}"
        self.leases.ensure_heartbeat()
        with self.ctx.engine.busy():
            claims = await self.ctx.engine.db(self._claim_and_read, refs, owner)
            outcomes = await asyncio.gather(
                *(self._run_claimed(ref, claims[ref.unit_id], owner) for ref in refs), return_exceptions=True
            )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes  # type: ignore[return-value]

    async def _run_claimed(self, ref: UnitRef, claimed: Claimed | UnitOutcome, owner: str) -> UnitOutcome:
        if isinstance(claimed, str):
            metrics.UNITS.labels(ref.kind, claimed).inc()
            return claimed
        structlog.contextvars.bind_contextvars(group_pk=ref.group_pk, unit_id=ref.unit_id, unit_kind=ref.kind)
        try:
            return await self._run_leased(ref, claimed, owner)
        finally:
            self.leases.dropped(ref.unit_id)

    async def _run_leased(self, ref: UnitRef, claimed: Claimed, owner: str) -> UnitOutcome:
        engine = self.ctx.engine
        CALL_OWNER.set(claimed.owner)  # this unit's task: its calls' tenant and run
        try:
            outcome = await UNIT_KINDS[ref.kind](self.ctx, claimed, owner)
        except Stopping:
            await engine.db(self.release, ref.unit_id, owner)
            outcome = "stopped"
        except JudgeUnavailable as exc:
            # Past the outage deadline: the group fails with the reason, whatever the
            # failure policy (an outage is never scored: docs/method.md, "Judge failures").
            await engine.db(self.ctx.fail_group, ref.group_pk, str(exc))
            outcome = "noop"
        except Exception as exc:
            metrics.UNITS.labels(ref.kind, "error").inc()
            log.exception("unit %s %s of group %s failed", ref.kind, ref.unit_id, ref.group_pk)
            await engine.db(self._unit_error, ref, exc)
            raise
        metrics.UNITS.labels(ref.kind, outcome).inc()
        return outcome

    def _claim_and_read(self, refs: Sequence[UnitRef], owner: str) -> dict[int, Claimed | UnitOutcome]:
        """Claim the units, then read the rollouts they need (one query per group), in
        one turn of a database thread: each unit finds its content cached."""
        claims = retry_lock_conflicts(self.claim, refs, owner)
        try:
            self.ctx.rollouts.preload(
                (c.group_pk, c.rollout_id)
                for c in claims.values()
                if isinstance(c, Claimed) and (c.payload is None or self.ctx.rollouts.header(c.group_pk) is None)
            )
        except Exception:  # the units are claimed: each reads its own rollout
            log.warning("reading the claimed units' rollouts failed; each unit reads its own", exc_info=True)
        return claims

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
            self.ctx.fail_group(ref.group_pk, f"work unit {ref.kind} {ref.unit_id} failed {attempts} times: {exc}")

    def claim(self, refs: Sequence[UnitRef], owner: str) -> dict[int, Claimed | UnitOutcome]:
        """Take the units' leases, count the delivery and read where each left off.

        A unit never delivered before has nothing stored, so only a redelivered one
        reads its stored judgments and support history.
        """
        rollouts = self.ctx.rollouts
        out: dict[int, Claimed | UnitOutcome] = {r.unit_id: "noop" for r in refs}
        by_id = {r.unit_id: r for r in refs}
        with self.db.session() as s:
            # A claim changes a group row only to start a queued group (its first claim):
            # only then does it lock the group rows, first and in id order as every
            # transaction does. Otherwise it waits on no batch write of those groups;
            # the units' own locks order it with a failing group's cancellation.
            group_pks = {r.group_pk for r in refs}
            groups = repo.group_states(s, group_pks)
            if any(state[0] == "queued" for state in groups.values()):
                groups = repo.group_states(s, group_pks, lock=True)
            units = [u for u in repo.units_for_claim(s, [r.unit_id for r in refs]) if _named(u, by_id[u.id])]
            headless = {u.group_pk for u in units if u.payload is not None and rollouts.header(u.group_pk) is None}
            for pk, question, rubrics in repo.group_headers(s, headless):
                rollouts.remember_header(pk, question, rubrics)
            stamp = utcnow()
            taken = []
            for unit in units:
                group = groups.get(unit.group_pk)
                if unit.status in ("done", "cancelled", "waiting") or group is None:
                    continue  # a waiting snippet call is released by the visits it waits on
                if group[0] not in ("queued", "running"):
                    continue
                expires = aware(unit.lease_expires_at) if unit.lease_expires_at else None
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
                stored_state(s, {u.group_pk for u in resumed}, {u.rollout_id for u in resumed})
                if resumed
                else ({}, {}, set())
            )
            # An outcome unit's calls come from its report's facts, as ingest found them
            # and as aggregation reads them.
            outcome_units = {r.unit_id for r in refs if r.kind == "outcome"}
            facts = repo.outcome_facts(s, {(u.group_pk, u.rollout_id) for u in taken if u.id in outcome_units})
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
                    params=rollouts.params(unit.group_pk, groups[unit.group_pk][1]),
                    done=frozenset(done.get(chain, ())),
                    history=tuple(history.get(chain, ())),
                    snippet_done=(unit.group_pk, unit.rollout_id, unit.turn_index or 0) in snippets_done,
                    payload=None
                    if unit.payload is None
                    else tuple(SearchResult.model_validate(r) for r in unit.payload),
                    resumed=unit.attempts > 0,
                    facts=stored_facts(facts.get((unit.group_pk, unit.rollout_id)))
                    if unit.id in outcome_units
                    else None,
                    owner=Owner(groups[unit.group_pk][2], groups[unit.group_pk][3] or ""),
                )
        return out

    def release(self, unit_id: int, owner: str) -> None:
        """Give the lease back so the next delivery can continue at once."""
        with self.db.session() as s:
            s.execute(
                update(m.WorkUnit)
                .where(m.WorkUnit.id == unit_id, m.WorkUnit.lease_owner == owner, m.WorkUnit.status == "running")
                .values(status="queued", lease_owner=None, lease_expires_at=None)
            )


def _named(unit: repo.UnitState, ref: UnitRef) -> bool:
    """Whether the message's unit is this row: its kind, group and rollout as sent.

    A message names its unit by row id only. One that is not this database's (a stack
    sharing the broker, a database recreated under a broker that kept its messages: ids
    start from 1 in each) must not run the row that happens to have its id: an outcome or
    snippet run finishes whatever unit it holds, so a visit chain ended unjudged and its
    group's aggregation found a visit judgment missing.
    """
    if unit.kind == ref.kind and unit.group_pk == ref.group_pk and ref.rollout_id in ("", unit.rollout_id):
        return True
    log.warning(
        "a message names unit %s as %s of group %s rollout %r, but it is %s of group %s rollout %r: left alone"
        " (is another deployment or an older database using this broker?)",
        ref.unit_id,
        ref.kind,
        ref.group_pk,
        ref.rollout_id,
        unit.kind,
        unit.group_pk,
        unit.rollout_id,
    )
    return False


def dispatch_queued(db: Database, dispatcher: Dispatcher, group_pks: Sequence[int]) -> int:
    """Send the queued units of these groups, group by group in the order given."""
    if not group_pks:
        return 0
    queued: dict[int, list[UnitRef]] = {pk: [] for pk in group_pks}
    with db.session() as s:
        for unit_id, kind, group_pk, rollout_id in s.execute(
            select(m.WorkUnit.id, m.WorkUnit.kind, m.WorkUnit.group_pk, m.WorkUnit.rollout_id)
            .where(m.WorkUnit.group_pk.in_(group_pks), m.WorkUnit.status == "queued")
            .order_by(m.WorkUnit.id)
        ):
            queued[group_pk].append(UnitRef(kind, unit_id, group_pk, rollout_id))  # type: ignore[arg-type]
    refs = [ref for pk in group_pks for ref in queued[pk]]
    dispatcher.dispatch(refs)
    return len(refs)


def aggregate_ready(db: Database, dispatcher: Dispatcher, group_pks: Sequence[int]) -> None:
    """Enqueue the aggregation of those of these groups whose every unit is done (the
    exactly-once flip: only the transaction that moves ``pending`` to ``enqueued`` sends it)."""
    if not group_pks:
        return
    with db.session() as s:
        flipped = repo.flip_aggregation(s, group_pks, utcnow())
    for group_pk in flipped:
        dispatcher.dispatch_aggregation(group_pk)
