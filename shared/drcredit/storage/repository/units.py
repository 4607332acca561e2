"""Work unit rows: claimed, started, finished, and waiting snippet calls released."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, tuple_, update
from sqlalchemy.orm import Session

from drcredit.storage import models as m
from drcredit.storage.database import postgres_driver

#: (group row id, rollout id)
RolloutKey = tuple[int, str]


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
    #: visit_chain, snippet or outcome: what a message naming the unit must say it is.
    kind: str


_UNIT_STATE = (
    "id, group_pk, rollout_id, rubric_id, turn_index, status, lease_owner, lease_expires_at, dedupe_turns,"
    " attempts, payload, kind"
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
            wu.kind,
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
