"""Which groups wait on a queue that no live worker consumes, and since when.

The queues without a consumer come from the workers' records in Redis
(:mod:`drcredit.broker.consumers`); this module reads the database for the work waiting
on them: units ``queued`` (or ``running`` under a lease that ran out: their worker is
gone) of a kind that queue serves, and aggregations sent to ``credit_aggregator``. A
group waits since the later of its oldest such work and the moment its queue's last
consumer was last seen.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.orm import Session

from drcredit.broker.queues import ALL_QUEUES, CREDIT_AGGREGATOR, UNIT_QUEUES
from drcredit.storage import models as m
from drcredit.storage.database import utcnow

OPEN = ("queued", "running")

#: Queue -> when its last consumer was last seen (None: none ever was).
IdleQueues = Mapping[str, datetime | None]


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _kinds(idle: Collection[str]) -> list[str]:
    return [kind for kind, queue in UNIT_QUEUES.items() if queue in idle]


def _waiting_units(group_pks: Collection[int] | None, kinds: list[str]) -> Any:
    """(group, kind, since, units) of the work of ``kinds`` that waits for a delivery."""
    now = utcnow()
    waiting = or_(
        m.WorkUnit.status == "queued",
        and_(m.WorkUnit.status == "running", m.WorkUnit.lease_expires_at < now),
    )
    since = case((m.WorkUnit.status == "queued", m.WorkUnit.updated_at), else_=m.WorkUnit.lease_expires_at)
    query = select(m.WorkUnit.group_pk, m.WorkUnit.kind, func.min(since), func.count()).where(
        m.WorkUnit.kind.in_(kinds), waiting
    )
    if group_pks is None:
        query = query.where(m.WorkUnit.group_pk.in_(select(m.Group.id).where(m.Group.status.in_(OPEN))))
    else:
        query = query.where(m.WorkUnit.group_pk.in_(group_pks))
    return query.group_by(m.WorkUnit.group_pk, m.WorkUnit.kind)


def _waiting_aggregations(group_pks: Collection[int] | None) -> Any:
    query = select(m.Group.id, m.Group.updated_at).where(m.Group.status.in_(OPEN), m.Group.aggregation == "enqueued")
    return query if group_pks is None else query.where(m.Group.id.in_(group_pks))


def _collect(s: Session, group_pks: Collection[int] | None, idle: IdleQueues) -> dict[int, dict[str, list[Any]]]:
    """group -> queue -> [since, units]."""
    found: dict[int, dict[str, list[Any]]] = {}
    kinds = _kinds(idle)
    if kinds:
        # Each kind of unit has a queue of its own: one row per (group, queue).
        for group_pk, kind, since, units in s.execute(_waiting_units(group_pks, kinds)):
            found.setdefault(group_pk, {})[UNIT_QUEUES[kind]] = [since, int(units)]
    if CREDIT_AGGREGATOR in idle:
        for group_pk, since in s.execute(_waiting_aggregations(group_pks)):
            found.setdefault(group_pk, {})[CREDIT_AGGREGATOR] = [since, 1]
    return found


def consumer_waits(s: Session, group_pks: Collection[int], idle: IdleQueues) -> dict[int, list[dict[str, Any]]]:
    """Each of these groups' waits on a queue without a consumer (``waiting_for_consumer``
    in the status document, docs/api.md): queue, since when, and the work units waiting
    (an aggregation counts as one). Groups that wait on none are left out."""
    if not idle or not group_pks:
        return {}
    out: dict[int, list[dict[str, Any]]] = {}
    for group_pk, queues in _collect(s, group_pks, idle).items():
        waits = []
        for queue in ALL_QUEUES:
            if queue not in queues:
                continue
            since, units = queues[queue]
            starts = [_aware(t) for t in (since, idle[queue]) if t is not None]
            waits.append({"queue": queue, "since": max(starts).isoformat() if starts else None, "units": units})
        out[group_pk] = waits
    return out


def groups_waiting(s: Session, idle: IdleQueues) -> dict[str, int]:
    """Open groups with work waiting on each queue without a consumer (0 for each such
    queue with none): the ``drcredit_groups_waiting_for_consumer`` gauge and ``/readyz``."""
    counts = dict.fromkeys(idle, 0)
    if idle:
        for queues in _collect(s, None, idle).values():
            for queue in queues:
                counts[queue] += 1
    return counts


def describe(waits: list[dict[str, Any]]) -> str:
    """One sentence for a 409 answer: what the group waits on and how to end the wait."""
    parts = [
        f"its work on queue {w['queue']} waits since {w['since']} for a worker, and no live worker consumes "
        f"that queue (start one: drcredit worker --queues {w['queue']})"
        for w in waits
    ]
    return "; ".join(parts)
