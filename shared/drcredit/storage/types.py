"""Column types of our own: timestamps that come back in UTC from every database."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """A ``timestamp with time zone`` that is always UTC on the Python side.

    SQLite keeps no zone and hands a stored time back naive; Postgres hands it back in the
    session's time zone. Either way the API's documents would print it differently from
    the ISO 8601 UTC (``+00:00``) they promise, so a value is stored as UTC and read back
    as an aware UTC datetime. A naive value given to store is taken to be UTC already.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    @property
    def python_type(self) -> type[datetime]:
        return datetime  # TypeDecorator would say ``object``; the bulk statements ask

    def process_bind_param(self, value: Any, dialect: Dialect) -> datetime | None:
        return None if value is None else as_utc(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        return None if value is None else as_utc(value)


def as_utc(value: datetime) -> datetime:
    """``value`` as an aware UTC datetime (naive: already UTC)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
