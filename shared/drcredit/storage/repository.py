"""The statements of the judging hot path: claiming units, finishing them, releasing
waiting snippet calls, counting progress, locking group rows.

Every judge call passes through a claim and a batch write, each a transaction of a few
statements. Built with SQLAlchemy Core, each statement cost the worker 200-500 us of
CPU (construction, cache key, parameters, results) on top of a 40 us round trip, and
IN lists of every length made Postgres parse and plan each statement anew: together
more CPU than the judge call itself (BENCHMARKS.md). On Postgres these statements are
therefore constant SQL run on the session's own driver connection, so psycopg prepares
each once per connection; lists travel as arrays. Other databases (SQLite, embedded
mode) take the same statements as SQLAlchemy Core. Callers pass the session whose
transaction the statement joins; the decisions stay with the caller.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, bindparam, select, tuple_, update
from sqlalchemy.orm import Session

from drcredit.storage import models as m
from drcredit.storage.database import dump_json, postgres_driver

#: (group row id, rollout id)
RolloutKey = tuple[int, str]


# ----------------------------------------------------------------------------- groups


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
) -> dict[int, tuple[str, dict[str, Any]]]:
    """Group row id -> (status, stored params); ``lock``: locked as :func:`lock_groups` does."""
    if not group_pks:
        return {}
    ids = sorted(group_pks)
    pg = postgres_driver(s)
    if pg is not None:
        tail = " ORDER BY id FOR NO KEY UPDATE" if lock else ""
        rows = pg.execute(f"SELECT id, status, params FROM groups WHERE id = ANY(%s){tail}", (ids,))
        return {pk: (status, params) for pk, status, params in rows}
    statement = select(m.Group.id, m.Group.status, m.Group.params).where(m.Group.id.in_(ids))
    if lock:
        statement = statement.order_by(m.Group.id).with_for_update(key_share=True)
    return {pk: (status, params) for pk, status, params in s.connection().execute(statement)}


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


# ----------------------------------------------------------------------------- work units


@dataclass(frozen=True)
class UnitState:
    """A work unit as a claim reads it."""

    id: int
    group_pk: int
    rollout_id: str
    rubric_id: str | None
    turn_index: int | None
    status: str
    lease_owner: str | None
    lease_expires_at: datetime | None
    #: Turn indices (visit, snippet units) or call keys (outcome units) with a possible twin.
    dedupe_turns: list[Any] | None
    attempts: int
    payload: list[Any] | None


_UNIT_STATE = (
    "id, group_pk, rollout_id, rubric_id, turn_index, status, lease_owner, lease_expires_at, dedupe_turns,"
    " attempts, payload"
)


def units_for_claim(s: Session, unit_ids: Collection[int]) -> list[UnitState]:
    """The units, locked (FOR UPDATE) in id order."""
    if not unit_ids:
        return []
    pg = postgres_driver(s)
    if pg is not None:
        rows = pg.execute(
            f"SELECT {_UNIT_STATE} FROM work_units WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (sorted(unit_ids),)
        )
        return [UnitState(*r) for r in rows]
    wu = m.WorkUnit
    result = s.connection().execute(
        select(
            wu.id,
            wu.group_pk,
            wu.rollout_id,
            wu.rubric_id,
            wu.turn_index,
            wu.status,
            wu.lease_owner,
            wu.lease_expires_at,
            wu.dedupe_turns,
            wu.attempts,
            wu.payload,
        )
        .where(wu.id.in_(sorted(unit_ids)))
        .order_by(wu.id)
        .with_for_update()
    )
    return [UnitState(*r) for r in result]


def start_units(s: Session, unit_ids: Collection[int], owner: str, expires: datetime, at: datetime) -> None:
    """Claimed units run under ``owner``'s lease; their delivery is counted."""
    if not unit_ids:
        return
    ids = sorted(unit_ids)
    pg = postgres_driver(s)
    if pg is not None:
        pg.execute(
            "UPDATE work_units SET status = 'running', attempts = attempts + 1, lease_owner = %s,"
            " lease_expires_at = %s, updated_at = %s WHERE id = ANY(%s)",
            (owner, expires, at, ids),
        )
        return
    wu = m.WorkUnit
    s.connection().execute(
        update(wu)
        .where(wu.id.in_(ids))
        .values(status="running", attempts=wu.attempts + 1, lease_owner=owner, lease_expires_at=expires)
    )


def finish_units(s: Session, unit_ids: Collection[int], at: datetime) -> list[int]:
    """Running units become done (one cancelled by its failed group stays so); returns the
    group of each unit finished."""
    if not unit_ids:
        return []
    ids = sorted(unit_ids)
    pg = postgres_driver(s)
    if pg is not None:
        rows = pg.execute(
            "UPDATE work_units SET status = 'done', updated_at = %s WHERE id = ANY(%s) AND status = 'running'"
            " RETURNING group_pk",
            (at, ids),
        )
        return [pk for (pk,) in rows]
    statement = (
        update(m.WorkUnit)
        .where(m.WorkUnit.id.in_(ids), m.WorkUnit.status == "running")
        .values(status="done")
        .returning(m.WorkUnit.group_pk)
    )
    return list(s.connection().scalars(statement))


def waiting_snippets(s: Session, rollouts: Iterable[RolloutKey]) -> list[tuple[int, int, str, int]]:
    """(unit id, group row id, rollout id, turn index) of these rollouts' waiting snippet calls."""
    pairs = sorted(set(rollouts))
    if not pairs:
        return []
    pg = postgres_driver(s)
    if pg is not None:
        rows = pg.execute(
            "SELECT w.id, w.group_pk, w.rollout_id, w.turn_index FROM work_units AS w"
            " JOIN unnest(%s::int[], %s::text[]) AS x(group_pk, rollout_id)"
            " ON w.group_pk = x.group_pk AND w.rollout_id = x.rollout_id"
            " WHERE w.kind = 'snippet' AND w.status = 'waiting'",
            ([g for g, _ in pairs], [r for _, r in pairs]),
        )
        return [(u, g, r, t or 0) for u, g, r, t in rows]
    wu = m.WorkUnit
    result = s.connection().execute(
        select(wu.id, wu.group_pk, wu.rollout_id, wu.turn_index).where(
            tuple_(wu.group_pk, wu.rollout_id).in_(pairs), wu.kind == "snippet", wu.status == "waiting"
        )
    )
    return [(u, g, r, t or 0) for u, g, r, t in result]


def visit_levels(s: Session, rollouts: Iterable[RolloutKey]) -> list[tuple[int, str, int, int | None]]:
    """(group row id, rollout id, turn index, level) of every stored visit judgment of these rollouts."""
    pairs = sorted(set(rollouts))
    if not pairs:
        return []
    pg = postgres_driver(s)
    if pg is not None:
        rows = pg.execute(
            "SELECT j.group_pk, j.rollout_id, j.turn_index, j.level FROM judgments AS j"
            " JOIN unnest(%s::int[], %s::text[]) AS x(group_pk, rollout_id)"
            " ON j.group_pk = x.group_pk AND j.rollout_id = x.rollout_id WHERE j.kind = 'visit'",
            ([g for g, _ in pairs], [r for _, r in pairs]),
        )
        return list(rows)
    j = m.Judgment
    return [
        tuple(r)  # type: ignore[misc]
        for r in s.connection().execute(
            select(j.group_pk, j.rollout_id, j.turn_index, j.level).where(
                tuple_(j.group_pk, j.rollout_id).in_(pairs), j.kind == "visit"
            )
        )
    ]


def release_waiting(s: Session, targets: Mapping[int, str], at: datetime) -> set[int]:
    """Move waiting units to their target status (``queued`` or ``done``); returns those
    moved (a unit another transaction moved first is not)."""
    if not targets:
        return set()
    ids = sorted(targets)
    pg = postgres_driver(s)
    if pg is not None:
        rows = pg.execute(
            "UPDATE work_units SET status = x.target, updated_at = %s FROM unnest(%s::int[], %s::text[]) AS x(id, target)"
            " WHERE work_units.id = x.id AND work_units.status = 'waiting' RETURNING work_units.id",
            (at, ids, [targets[i] for i in ids]),
        )
        return {unit_id for (unit_id,) in rows}
    moved: set[int] = set()
    for unit_id in ids:
        changed = (
            s.connection()
            .execute(
                update(m.WorkUnit)
                .where(m.WorkUnit.id == unit_id, m.WorkUnit.status == "waiting")
                .values(status=targets[unit_id])
            )
            .rowcount
        )
        if changed:
            moved.add(unit_id)
    return moved


# ----------------------------------------------------------------------------- content and results


def rollout_document(s: Session, group_pk: int, rollout_id: str) -> dict[str, Any] | None:
    """The group's question and rubrics with one rollout's turn bodies, as stored (one query)."""
    pg = postgres_driver(s)
    if pg is not None:
        rows = pg.execute(
            "SELECT g.question, g.rubrics, r.outcome_reward, t.body FROM groups AS g"
            " JOIN rollouts AS r ON r.group_pk = g.id AND r.rollout_id = %s"
            " LEFT JOIN turns AS t ON t.rollout_pk = r.id WHERE g.id = %s ORDER BY t.index",
            (rollout_id, group_pk),
        ).fetchall()
        if not rows:
            return None
        question, rubrics, reward, _ = rows[0]
        bodies = [body for *_, body in rows if body is not None]
    else:
        head = s.execute(
            select(m.Group.question, m.Group.rubrics, m.Rollout.id, m.Rollout.outcome_reward)
            .join(m.Rollout, m.Rollout.group_pk == m.Group.id)
            .where(m.Group.id == group_pk, m.Rollout.rollout_id == rollout_id)
        ).one_or_none()
        if head is None:
            return None
        question, rubrics, rollout_pk, reward = head
        bodies = list(s.scalars(select(m.Turn.body).where(m.Turn.rollout_pk == rollout_pk).order_by(m.Turn.index)))
    return {
        "question": question,
        "rubrics": rubrics,
        "rollouts": [{"id": rollout_id, "outcome_reward": reward, "turns": bodies}],
    }


#: The per-turn results aggregation writes (columns of ``turns``).
TURN_RESULTS = (
    "credit",
    "visit_credit",
    "visit_credit_uncapped",
    "navigation_credit",
    "snippet_credit",
    "snippet_matches",
    "process_advantage",
    "discounted_process_advantage",
    "advantage",
    "unscorable",
)
_TURN_RESULT_TYPES = ("float8", "float8", "float8", "float8", "float8", "int", "float8", "float8", "float8", "bool")


def store_results(
    s: Session, turns: Sequence[tuple[int, Sequence[Any]]], rollouts: Sequence[tuple[int, float]]
) -> None:
    """Write aggregation's results: per turn row id its :data:`TURN_RESULTS` values, per
    rollout row id its outcome advantage."""
    pg = postgres_driver(s)
    if pg is not None:
        columns = ", ".join(f"{c} = x.{c}" for c in TURN_RESULTS)
        arrays = ", ".join(f"%s::{t}[]" for t in _TURN_RESULT_TYPES)
        pg.execute(
            f"UPDATE turns SET {columns} FROM unnest(%s::int[], {arrays}) AS x(id, {', '.join(TURN_RESULTS)})"
            " WHERE turns.id = x.id",
            ([pk for pk, _ in turns], *([values[k] for _, values in turns] for k in range(len(TURN_RESULTS)))),
        )
        pg.execute(
            "UPDATE rollouts SET outcome_advantage = x.a FROM unnest(%s::int[], %s::float8[]) AS x(id, a)"
            " WHERE rollouts.id = x.id",
            ([pk for pk, _ in rollouts], [a for _, a in rollouts]),
        )
        return
    turns_table: Table = m.Turn.__table__  # type: ignore[assignment]
    rollouts_table: Table = m.Rollout.__table__  # type: ignore[assignment]
    if turns:
        s.connection().execute(
            update(turns_table).where(turns_table.c.id == bindparam("pk")),
            [{"pk": pk, **dict(zip(TURN_RESULTS, values, strict=True))} for pk, values in turns],
        )
    if rollouts:
        s.connection().execute(
            update(rollouts_table).where(rollouts_table.c.id == bindparam("pk")),
            [{"pk": pk, "outcome_advantage": a} for pk, a in rollouts],
        )


# ----------------------------------------------------------------------------- aggregation


@dataclass(frozen=True)
class GroupForAggregation:
    """What aggregation reads of a group row (locked)."""

    status: str
    aggregation: str
    params: dict[str, Any]
    question: str
    rubrics: list[Any]
    created_at: datetime


def group_for_aggregation(s: Session, group_pk: int) -> GroupForAggregation | None:
    """The group row, locked (FOR NO KEY UPDATE): a second delivery of its aggregation waits here."""
    columns = "status, aggregation, params, question, rubrics, created_at"
    pg = postgres_driver(s)
    if pg is not None:
        row = pg.execute(f"SELECT {columns} FROM groups WHERE id = %s FOR NO KEY UPDATE", (group_pk,)).fetchone()
    else:
        g = m.Group
        row = (
            s.connection()
            .execute(
                select(g.status, g.aggregation, g.params, g.question, g.rubrics, g.created_at)
                .where(g.id == group_pk)
                .with_for_update(key_share=True)
            )
            .one_or_none()
        )
    return None if row is None else GroupForAggregation(*row)


def rollout_outlines(s: Session, group_pk: int) -> list[tuple[int, str, float | None, list[Any] | None]]:
    """(row id, rollout id, outcome reward, outline) of the group's rollouts in posted order."""
    pg = postgres_driver(s)
    if pg is not None:
        return list(
            pg.execute(
                "SELECT id, rollout_id, outcome_reward, outline FROM rollouts WHERE group_pk = %s ORDER BY position",
                (group_pk,),
            )
        )
    r = m.Rollout
    return [
        tuple(row)
        for row in s.connection().execute(
            select(r.id, r.rollout_id, r.outcome_reward, r.outline).where(r.group_pk == group_pk).order_by(r.position)
        )
    ]


def turn_ids(s: Session, rollout_pks: Collection[int]) -> dict[int, list[int]]:
    """Rollout row id -> its turns' row ids in turn order."""
    out: dict[int, list[int]] = {}
    if not rollout_pks:
        return out
    pg = postgres_driver(s)
    if pg is not None:
        rows: Iterable[tuple[int, int]] = pg.execute(
            "SELECT rollout_pk, id FROM turns WHERE rollout_pk = ANY(%s) ORDER BY rollout_pk, index",
            (sorted(rollout_pks),),
        )
    else:
        rows = s.connection().execute(
            select(m.Turn.rollout_pk, m.Turn.id)
            .where(m.Turn.rollout_pk.in_(sorted(rollout_pks)))
            .order_by(m.Turn.rollout_pk, m.Turn.index)
        )
    for rollout_pk, turn_pk in rows:
        out.setdefault(rollout_pk, []).append(turn_pk)
    return out


def judgment_outcomes(s: Session, group_pk: int) -> list[tuple[str, str, int, str, str, int | None, int | None]]:
    """(kind, rollout id, turn index, rubric id, status, level, match count) of the group's judgments."""
    columns = "kind, rollout_id, turn_index, rubric_id, status, level, match_count"
    pg = postgres_driver(s)
    if pg is not None:
        return list(pg.execute(f"SELECT {columns} FROM judgments WHERE group_pk = %s", (group_pk,)))
    j = m.Judgment
    return [
        tuple(row)  # type: ignore[misc]
        for row in s.connection().execute(
            select(j.kind, j.rollout_id, j.turn_index, j.rubric_id, j.status, j.level, j.match_count).where(
                j.group_pk == group_pk
            )
        )
    ]


def finish_group(s: Session, group_pk: int, stats: dict[str, Any] | None, error: str | None, at: datetime) -> None:
    """Mark an aggregated group done with its stats, or failed with ``error``."""
    pg = postgres_driver(s)
    if pg is not None:
        if error is None:
            pg.execute(
                "UPDATE groups SET status = 'done', aggregation = 'done', stats = %s::json, finished_at = %s,"
                " started_at = COALESCE(started_at, %s), updated_at = %s WHERE id = %s",
                (dump_json(stats), at, at, at, group_pk),
            )
        else:
            pg.execute(
                "UPDATE groups SET status = 'failed', error = %s, finished_at = %s, updated_at = %s WHERE id = %s",
                (error, at, at, group_pk),
            )
        return
    g = m.Group
    values: dict[str, Any] = (
        {"status": "done", "aggregation": "done", "stats": stats, "finished_at": at}
        if error is None
        else {"status": "failed", "error": error, "finished_at": at}
    )
    s.connection().execute(update(g).where(g.id == group_pk).values(**values))
    if error is None:
        s.connection().execute(update(g).where(g.id == group_pk, g.started_at.is_(None)).values(started_at=at))
