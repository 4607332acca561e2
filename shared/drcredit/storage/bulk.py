"""Many judgments stored in one statement.

The batch writer stores the judgments of every chain of a process together. On
Postgres the whole batch is one constant statement with one JSON parameter: the server
unpacks the rows and inserts the judgments (skipping any another delivery already
stored) in one round trip, and the driver parses and plans the same SQL text every
time. A multi-row INSERT built by the ORM has a different text for every batch size
and costs the worker more CPU than the judge call it records.
SQLite (embedded mode) takes the portable path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy import JSON, Table, insert, select, tuple_, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from drcredit.storage import models as m
from drcredit.storage.database import dump_json, postgres_driver

#: The columns that identify a judgment (its unique constraint).
JUDGMENT_KEY = ("group_pk", "kind", "rollout_id", "turn_index", "rubric_id")
JUDGMENT_COLUMNS = tuple(c.name for c in m.Judgment.__table__.columns if c.name != "id")
#: Scalar defaults of the model, for values a row leaves out (a statement that names a
#: column inserts what it is given, NULL included, not the column's default).
_JUDGMENT_DEFAULTS = {
    c.name: c.default.arg for c in m.Judgment.__table__.columns if c.default is not None and c.default.is_scalar
}


def _column_values(row: JudgmentRow) -> dict[str, Any]:
    return {c: row.values.get(c, _JUDGMENT_DEFAULTS.get(c)) for c in JUDGMENT_COLUMNS}


@dataclass(frozen=True)
class JudgmentRow:
    """A judgment's column values (its attempts among them, as a JSON list).

    ``values["prior_support"]`` is the length of the history the judgment was made
    against: only one chain appends to a (rollout, rubric) history.
    """

    values: dict[str, Any]

    @property
    def key(self) -> tuple[Any, ...]:
        return tuple(self.values[c] for c in JUDGMENT_KEY)


def store_judgments(s: Session, rows: Sequence[JudgmentRow]) -> set[int]:
    """Insert the rows that are not stored yet; returns the indices of those inserted."""
    if not rows:
        return set()
    pg = postgres_driver(s)
    if pg is not None:
        return _store_postgres(pg, rows)
    return _store_portable(s, rows)


def copy_rows(s: Session, table: Table, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Append rows to ``table`` in the session's transaction: COPY on Postgres.

    Ingest writes a step's turn bodies, megabytes of page text: COPY streams them in
    one command, where an INSERT per row (even pipelined) cost the API more CPU than
    validating the whole batch. Values are Python values, as for an INSERT.
    """
    pg = postgres_driver(s)
    if pg is not None:
        as_json = [isinstance(table.c[c].type, JSON) for c in columns]
        names = ", ".join(f'"{c}"' for c in columns)
        with pg.cursor() as cursor, cursor.copy(f'COPY "{table.name}" ({names}) FROM STDIN') as copy:
            for row in rows:
                copy.write_row([dump_json(v) if j and v is not None else v for v, j in zip(row, as_json, strict=True)])
        return
    s.connection().execute(insert(table), [dict(zip(columns, row, strict=True)) for row in rows])


def held_leases(s: Session, leases: Sequence[tuple[int, str]]) -> set[int]:
    """The units of these (unit, owner) leases that their owner still holds (read only).

    Renewing a lease rewrites its unit's row; a batch whose leases are far from expiring
    only needs to know they are still held (not taken over, not cancelled).
    """
    if not leases:
        return set()
    pg = postgres_driver(s)
    if pg is not None:
        return {unit_id for (unit_id,) in pg.execute(_PG_HELD, {"leases": _leases_json(leases)})}
    return set(
        s.connection().scalars(
            select(m.WorkUnit.id).where(
                tuple_(m.WorkUnit.id, m.WorkUnit.lease_owner).in_(leases), m.WorkUnit.status == "running"
            )
        )
    )


def renew_leases(s: Session, leases: Sequence[tuple[int, str]], expires: datetime) -> set[int]:
    """Extend the leases still held by their (unit, owner); returns the units kept."""
    if not leases:
        return set()
    pg = postgres_driver(s)
    if pg is not None:
        params = {"leases": _leases_json(leases), "expires": expires, "now": datetime.now(expires.tzinfo)}
        return {unit_id for (unit_id,) in pg.execute(_PG_RENEW, params)}
    return set(
        s.scalars(
            update(m.WorkUnit)
            .where(tuple_(m.WorkUnit.id, m.WorkUnit.lease_owner).in_(leases), m.WorkUnit.status == "running")
            .values(lease_expires_at=expires)
            .returning(m.WorkUnit.id)
        )
    )


# ----------------------------------------------------------------------------- Postgres

_JSON_COLUMNS = {"page_ids", "support_points", "matches", "rejected_matches", "answer", "attempts"}


def _pg_type(column: str) -> str:
    if column in _JSON_COLUMNS:
        return "json"
    sql_type = m.Judgment.__table__.c[column].type
    python = sql_type.python_type
    if python is bool:
        return "boolean"
    if python is int:
        return "int"
    if python is float:
        return "float8"
    if python is datetime:
        return "timestamptz"
    return "text"


def _pg_store_sql() -> str:
    fields = ", ".join(f"{c} {_pg_type(c)}" for c in JUDGMENT_COLUMNS)
    columns = ", ".join(JUDGMENT_COLUMNS)
    key = ", ".join(JUDGMENT_KEY)
    table: Table = m.Judgment.__table__  # type: ignore[assignment]
    unique = next(
        c.name
        for c in table.constraints
        if c.name and {col.name for col in getattr(c, "columns", ())} == set(JUDGMENT_KEY)
    )
    return f"""
WITH input AS (
    SELECT * FROM json_to_recordset(CAST(%(rows)s AS json)) AS x(n int, {fields})
), inserted AS (
    INSERT INTO judgments ({columns})
    SELECT {columns} FROM input ORDER BY n
    ON CONFLICT ON CONSTRAINT {unique} DO NOTHING
    RETURNING {key}
)
SELECT input.n FROM inserted JOIN input USING ({key})
"""


_PG_STORE = _pg_store_sql()


def _leases_json(leases: Sequence[tuple[int, str]]) -> str:
    """(unit, owner) pairs as the JSON parameter of the lease statements below."""
    return dump_json([{"id": unit_id, "owner": owner} for unit_id, owner in leases])


_PG_HELD = """
SELECT work_units.id FROM work_units
JOIN json_to_recordset(CAST(%(leases)s AS json)) AS x(id int, owner text)
ON work_units.id = x.id AND work_units.lease_owner = x.owner
WHERE work_units.status = 'running'
"""

# The rows are locked in id order first, as every transaction locking units does: the
# heartbeat and a write batch of the same process renew overlapping leases, and an
# UPDATE ... FROM takes its rows in whatever order its join yields (Postgres broke
# the resulting deadlocks by aborting one of them).
_PG_RENEW = """
WITH held AS (
    SELECT w.id FROM work_units AS w
    JOIN json_to_recordset(CAST(%(leases)s AS json)) AS x(id int, owner text)
      ON w.id = x.id AND w.lease_owner = x.owner
    WHERE w.status = 'running'
    ORDER BY w.id
    FOR UPDATE OF w
)
UPDATE work_units SET lease_expires_at = %(expires)s, updated_at = %(now)s
FROM held WHERE work_units.id = held.id
RETURNING work_units.id
"""


def _store_postgres(pg: psycopg.Connection[Any], rows: Sequence[JudgmentRow]) -> set[int]:
    payload = [{**_column_values(row), "n": n} for n, row in enumerate(rows)]
    return {n for (n,) in pg.execute(_PG_STORE, {"rows": dump_json(payload)})}


# ----------------------------------------------------------------------------- portable


def _store_portable(s: Session, rows: Sequence[JudgmentRow]) -> set[int]:
    table: Table = m.Judgment.__table__  # type: ignore[assignment]
    statement = (
        sqlite.insert(table)
        .on_conflict_do_nothing(index_elements=list(JUDGMENT_KEY))
        .returning(*(table.c[c] for c in JUDGMENT_KEY))
    )
    inserted = {tuple(r) for r in s.execute(statement, [_column_values(row) for row in rows])}
    return {n for n, row in enumerate(rows) if row.key in inserted}
