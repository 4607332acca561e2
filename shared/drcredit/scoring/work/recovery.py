"""Work that lost its process or its message, found again from the database.

The database, not the broker, is the record of what is left to do. :func:`resume` runs
when an embedded service starts (its own units were left ``running``); :func:`sweep`
runs periodically in every deployment and picks up what a dead worker or a lost message
left behind. Both are safe to run concurrently and repeatedly: a conditional update
makes one sweeper win each unit, and a duplicate delivery finds it done or leased.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import aliased

from drcredit.scoring.dispatch import Dispatcher, UnitRef
from drcredit.scoring.work.lifecycle import aggregate_ready, dispatch_queued
from drcredit.scoring.work.snippet_release import SnippetRelease
from drcredit.storage import models as m
from drcredit.storage.database import Database, rows_changed, utcnow

log = logging.getLogger("drcredit.recovery")

OPEN = ("queued", "running")


def resume(db: Database, dispatcher: Dispatcher, snippets: SnippetRelease) -> int:
    """Re-dispatch the unfinished work of every open group (after a restart).

    Units left ``running`` by a stopped process are queued again: they continue from
    their last stored judgment, so nothing is judged twice. Returns the units queued.
    """
    with db.session() as s:
        # A group held for its tenant's budget is sent when released (drcredit.tenancy.budgets).
        groups = list(s.scalars(select(m.Group.id).where(m.Group.status.in_(OPEN), m.Group.held_until.is_(None))))
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
    queued = dispatch_queued(db, dispatcher, groups)
    for group_pk, rollout_id in waiting:
        snippets.release(group_pk, rollout_id)
    aggregate_ready(db, dispatcher, groups)
    return queued


def sweep(
    db: Database,
    dispatcher: Dispatcher,
    snippets: SnippetRelease,
    stale_after_s: float,
    skip_kinds: Collection[str] = (),
    skip_aggregations: bool = False,
) -> int:
    """Re-dispatch work whose broker message may be lost; returns units re-dispatched.

    A unit queued longer than ``stale_after_s`` ago, or running under a lease that
    expired that long ago, is dispatched again. Groups whose units are all done but
    whose aggregation never ran are aggregated. Units of ``skip_kinds`` (and with
    ``skip_aggregations`` the aggregations) are left alone: no live worker consumes their
    queue, so their message waits for one, and sending it again every sweep would only pile
    copies in the queue; a sweep after a consumer appears sends what is still missing.
    """
    cutoff = utcnow() - timedelta(seconds=stale_after_s)
    refs: list[UnitRef] = []
    with db.session() as s:
        open_groups = select(m.Group.id).where(m.Group.status.in_(OPEN), m.Group.held_until.is_(None))
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
            if kind in skip_kinds:
                continue
            touched = rows_changed(
                s,
                update(m.WorkUnit)
                .where(m.WorkUnit.id == unit_id, m.WorkUnit.status == status, m.WorkUnit.updated_at == updated)
                .values(status="queued", lease_owner=None, lease_expires_at=None, updated_at=utcnow()),
            )
            if touched:
                refs.append(UnitRef(kind, unit_id, group_pk, rollout_id))  # type: ignore[arg-type]
        stuck = list(
            s.scalars(
                select(m.Group.id).where(
                    m.Group.status.in_(OPEN), m.Group.aggregation == "enqueued", m.Group.updated_at <= cutoff
                )
            )
        )
        for group_pk in sorted(stuck) if not skip_aggregations else ():
            rows_changed(
                s,
                update(m.Group)
                .where(m.Group.id == group_pk, m.Group.aggregation == "enqueued")
                .values(aggregation="pending", updated_at=utcnow()),
            )
        # Waiting snippet calls are released by the visits they wait on, when those are
        # stored; the sweep only catches a release that was missed, which can be only in
        # a rollout whose visit chains are all finished. Releasing the others here would
        # lock their groups every few seconds for nothing (measured: 6% of a worker's CPU).
        chains = aliased(m.WorkUnit)
        unfinished_chains = (
            select(chains.id)
            .where(
                chains.group_pk == m.WorkUnit.group_pk,
                chains.rollout_id == m.WorkUnit.rollout_id,
                chains.kind == "visit_chain",
                chains.status.in_(("queued", "running")),
            )
            .exists()
        )
        waiting = s.execute(
            select(m.WorkUnit.group_pk, m.WorkUnit.rollout_id)
            .where(m.WorkUnit.group_pk.in_(open_groups), m.WorkUnit.status == "waiting", ~unfinished_chains)
            .distinct()
        ).all()
        pending = list(s.scalars(open_groups))
    if refs:
        # Also what a queue holds for a consumer that has just started: those messages are
        # still in the queue, and the copies sent here find their units taken.
        log.warning(
            "sending again %d work units queued or leased too long (a lost message or worker, or a"
            " consumer just started; a duplicate delivery finds its unit taken)",
            len(refs),
        )
        dispatcher.dispatch(refs)
    for group_pk, rollout_id in waiting:
        snippets.release(group_pk, rollout_id)
    aggregate_ready(db, dispatcher, pending)
    return len(refs)
