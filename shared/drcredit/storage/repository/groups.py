"""Group rows: their locks, states, progress counts and the exactly-once aggregation flip."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from drcredit.storage import models as m
from drcredit.storage.database import dump_json, postgres_driver


def lock_groups(s: Session, group_pks: Collection[int]) -> None:
    """Lock group rows in id order (FOR NO KEY UPDATE: inserts referencing them still pass).

    Every transaction that locks group rows takes them in id order first, so that two
    workers' transactions never wait on each other's groups in a cycle.
    """
    if not group_pks:
        return
    ids = sorted(group_pks)
    pg = postgres_driver(s)
    if pg is not None:
        pg.execute("SELECT id FROM groups WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE", (ids,))
        return
    s.connection().execute(
        select(m.Group.id).where(m.Group.id.in_(ids)).order_by(m.Group.id).with_for_update(key_share=True)
    )


def group_states(
    s: Session, group_pks: Collection[int], *, lock: bool = False
) -> dict[int, tuple[str, dict[str, Any], str, str | None]]:
    """Group row id -> (status, stored params, tenant, run); ``lock``: locked as
    :func:`lock_groups` does."""
    if not group_pks:
        return {}
    ids = sorted(group_pks)
    pg = postgres_driver(s)
    if pg is not None:
        tail = " ORDER BY id FOR NO KEY UPDATE" if lock else ""
        rows = pg.execute(f"SELECT id, status, params, tenant, run FROM groups WHERE id = ANY(%s){tail}", (ids,))
        return {pk: (status, params, tenant, run) for pk, status, params, tenant, run in rows}
    statement = select(m.Group.id, m.Group.status, m.Group.params, m.Group.tenant, m.Group.run).where(
        m.Group.id.in_(ids)
    )
    if lock:
        statement = statement.order_by(m.Group.id).with_for_update(key_share=True)
    return {pk: (status, params, tenant, run) for pk, status, params, tenant, run in s.connection().execute(statement)}


def group_headers(s: Session, group_pks: Collection[int]) -> list[tuple[int, str, Any]]:
    """(group row id, question, stored rubrics) of each group."""
    if not group_pks:
        return []
    pg = postgres_driver(s)
    if pg is not None:
        return list(pg.execute("SELECT id, question, rubrics FROM groups WHERE id = ANY(%s)", (list(group_pks),)))
    return [
        tuple(r)
        for r in s.connection().execute(
            select(m.Group.id, m.Group.question, m.Group.rubrics).where(m.Group.id.in_(list(group_pks)))
        )
    ]


def start_groups(s: Session, group_pks: Collection[int], at: datetime) -> None:
    """Queued groups whose first unit was claimed become running."""
    if not group_pks:
        return
    ids = sorted(group_pks)
    pg = postgres_driver(s)
    if pg is not None:
        pg.execute(
            "UPDATE groups SET status = 'running', started_at = %s, updated_at = %s"
            " WHERE id = ANY(%s) AND status = 'queued'",
            (at, at, ids),
        )
        return
    s.connection().execute(
        update(m.Group).where(m.Group.id.in_(ids), m.Group.status == "queued").values(status="running", started_at=at)
    )


def add_units_done(s: Session, counts: Mapping[int, int], at: datetime) -> None:
    """Add finished units to their groups' counts (group row locks taken by the caller)."""
    if not counts:
        return
    ids = sorted(counts)
    pg = postgres_driver(s)
    if pg is not None:
        pg.execute(
            "UPDATE groups SET units_done = groups.units_done + x.n, updated_at = %s"
            " FROM unnest(%s::int[], %s::int[]) AS x(id, n) WHERE groups.id = x.id",
            (at, ids, [counts[i] for i in ids]),
        )
        return
    for group_pk in ids:
        s.connection().execute(
            update(m.Group).where(m.Group.id == group_pk).values(units_done=m.Group.units_done + counts[group_pk])
        )


_FLIP_CONDITIONS = (
    "aggregation = 'pending' AND units_done = units_total AND rollouts_received = expected_rollouts"
    " AND status IN ('queued', 'running')"
)


def flip_aggregation(s: Session, group_pks: Collection[int], at: datetime) -> list[int]:
    """The conditional update that lets exactly one finisher schedule each group's aggregation.

    Returns the groups whose every unit is done and whose aggregation this call enqueued.
    """
    if not group_pks:
        return []
    ids = sorted(group_pks)
    pg = postgres_driver(s)
    if pg is not None:
        rows = pg.execute(
            f"UPDATE groups SET aggregation = 'enqueued', updated_at = %s WHERE id = ANY(%s) AND {_FLIP_CONDITIONS}"
            " RETURNING id",
            (at, ids),
        )
        return [pk for (pk,) in rows]
    statement = (
        update(m.Group)
        .where(
            m.Group.id.in_(ids),
            m.Group.aggregation == "pending",
            m.Group.units_done == m.Group.units_total,
            m.Group.rollouts_received == m.Group.expected_rollouts,
            m.Group.status.in_(("queued", "running")),
        )
        .values(aggregation="enqueued")
        .returning(m.Group.id)
    )
    return list(s.connection().scalars(statement))


def finish_group(
    s: Session,
    group_pk: int,
    stats: dict[str, Any] | None,
    error: str | None,
    at: datetime,
    advantages_json: str | None = None,
) -> None:
    """Mark an aggregated group done with its stats and advantages document, or failed
    with ``error``."""
    pg = postgres_driver(s)
    if pg is not None:
        if error is None:
            pg.execute(
                "UPDATE groups SET status = 'done', aggregation = 'done', stats = %s::json, advantages_json = %s,"
                " finished_at = %s, started_at = COALESCE(started_at, %s), updated_at = %s WHERE id = %s",
                (dump_json(stats), advantages_json, at, at, at, group_pk),
            )
        else:
            pg.execute(
                "UPDATE groups SET status = 'failed', error = %s, finished_at = %s, updated_at = %s WHERE id = %s",
                (error, at, at, group_pk),
            )
        return
    g = m.Group
    values: dict[str, Any] = (
        {"status": "done", "aggregation": "done", "stats": stats, "advantages_json": advantages_json, "finished_at": at}
        if error is None
        else {"status": "failed", "error": error, "finished_at": at}
    )
    s.connection().execute(update(g).where(g.id == group_pk).values(**values))
    if error is None:
        s.connection().execute(update(g).where(g.id == group_pk, g.started_at.is_(None)).values(started_at=at))
