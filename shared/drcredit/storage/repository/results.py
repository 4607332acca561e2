"""What units and aggregation read of a group's content, and the results aggregation stores."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session

from drcredit.storage import models as m
from drcredit.storage.database import dump_json, postgres_driver


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


def rollout_documents(s: Session, group_pk: int, rollout_ids: Collection[str]) -> dict[str, dict[str, Any]]:
    """:func:`rollout_document` of several rollouts of a group, in one query."""
    if not rollout_ids:
        return {}
    wanted = sorted(rollout_ids)
    pg = postgres_driver(s)
    rows: Sequence[Any]
    if pg is not None:
        rows = pg.execute(
            "SELECT g.question, g.rubrics, r.rollout_id, r.outcome_reward, t.body FROM groups AS g"
            " JOIN rollouts AS r ON r.group_pk = g.id AND r.rollout_id = ANY(%s)"
            " LEFT JOIN turns AS t ON t.rollout_pk = r.id WHERE g.id = %s ORDER BY r.rollout_id, t.index",
            (wanted, group_pk),
        ).fetchall()
    else:
        rows = s.execute(
            select(m.Group.question, m.Group.rubrics, m.Rollout.rollout_id, m.Rollout.outcome_reward, m.Turn.body)
            .join(m.Rollout, m.Rollout.group_pk == m.Group.id)
            .outerjoin(m.Turn, m.Turn.rollout_pk == m.Rollout.id)
            .where(m.Group.id == group_pk, m.Rollout.rollout_id.in_(wanted))
            .order_by(m.Rollout.rollout_id, m.Turn.index)
        ).all()
    out: dict[str, dict[str, Any]] = {}
    for question, rubrics, rollout_id, reward, body in rows:
        document = out.get(rollout_id)
        if document is None:
            rollout = {"id": rollout_id, "outcome_reward": reward, "turns": []}
            document = out[rollout_id] = {"question": question, "rubrics": rubrics, "rollouts": [rollout]}
        if body is not None:
            document["rollouts"][0]["turns"].append(body)
    return out


def outcome_facts(s: Session, wanted: Collection[tuple[int, str]]) -> dict[tuple[int, str], dict[str, Any]]:
    """The report facts ingest stored for these (group, rollout) pairs (one query); pairs
    without any (outcome not judged: JSON null) are left out."""
    if not wanted:
        return {}
    group_pks, rollout_ids = sorted({g for g, _ in wanted}), sorted({r for _, r in wanted})
    pg = postgres_driver(s)
    rows: Sequence[Any]
    if pg is not None:
        rows = pg.execute(
            "SELECT group_pk, rollout_id, outcome_facts FROM rollouts"
            " WHERE group_pk = ANY(%s) AND rollout_id = ANY(%s)",
            (group_pks, rollout_ids),
        ).fetchall()
    else:
        rows = s.execute(
            select(m.Rollout.group_pk, m.Rollout.rollout_id, m.Rollout.outcome_facts).where(
                m.Rollout.group_pk.in_(group_pks),
                m.Rollout.rollout_id.in_(rollout_ids),
            )
        ).all()
    return {(g, r): doc for g, r, doc in rows if (g, r) in wanted and doc is not None}


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
    s: Session,
    turns: Sequence[tuple[int, Sequence[Any]]],
    rollouts: Sequence[tuple[int, float]],
    outcomes: Sequence[tuple[int, float | None, dict[str, Any]]] = (),
) -> None:
    """Write aggregation's results: per turn row id its :data:`TURN_RESULTS` values, per
    rollout row id its outcome advantage, and with ``outcome_source: judge`` per rollout
    row id the outcome reward the service computed and its breakdown. One statement per
    kind of row, whatever the group's size."""
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
        if outcomes:
            pg.execute(
                "UPDATE rollouts SET outcome_reward = x.r, outcome = x.o::json"
                " FROM unnest(%s::int[], %s::float8[], %s::text[]) AS x(id, r, o) WHERE rollouts.id = x.id",
                ([pk for pk, _, _ in outcomes], [r for _, r, _ in outcomes], [dump_json(o) for _, _, o in outcomes]),
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
    if outcomes:
        s.connection().execute(
            update(rollouts_table).where(rollouts_table.c.id == bindparam("pk")),
            [{"pk": pk, "outcome_reward": r, "outcome": o} for pk, r, o in outcomes],
        )


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
