"""Engine and session factory for SQLite (embedded) or Postgres (deployment)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import orjson
import psycopg
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random

T = TypeVar("T")


def dump_json(value: Any) -> str:
    """JSON as the database stores it (the engine's serializer, and bulk parameters).

    Turn bodies and judge answers are most of what is written: orjson encodes them
    several times faster than the stdlib (same JSON, keys in insertion order).
    """
    return orjson.dumps(value).decode()


def make_engine(url: str, pool_size: int = 10) -> Engine:
    json_options: dict[str, Any] = {"json_serializer": dump_json, "json_deserializer": orjson.loads}
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 60},
            pool_size=pool_size,
            max_overflow=pool_size,
            **json_options,
        )
        _serialize_sqlite_writers(engine)
        return engine
    engine = create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_recycle=1800, **json_options)
    _ping_idle_connections(engine)
    return engine


#: A pooled connection idle longer than this is pinged before it is handed out. Under
#: load a connection goes back to work within milliseconds, and pinging each checkout
#: (``pool_pre_ping``) was a round trip per transaction; a connection back in the pool
#: for longer may have outlived a database restart.
PING_AFTER_IDLE_S = 1.0


def _ping_idle_connections(engine: Engine) -> None:
    """Ping a connection on checkout only when it sat idle past PING_AFTER_IDLE_S.

    A failed ping raises DisconnectionError, on which the pool replaces the connection
    (SQLAlchemy's checkout-event contract). A connection that broke within the idle
    window fails its transaction, as one in flight when the database went away does,
    and that disconnect invalidates the whole pool.
    """

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError(f"connection idle {time.monotonic() - idle_since:.0f} s failed its ping") from exc


#: Execution option of a read-only session (see :meth:`Database.read_session`).
READ_ONLY = "drcredit_read_only"


def _serialize_sqlite_writers(engine: Engine) -> None:
    """Take SQLite's write lock when a transaction begins.

    pysqlite's deferred transactions upgrade read locks to write locks mid-transaction,
    which fails at once with "database is locked" when threads write concurrently.
    Beginning IMMEDIATE makes concurrent writers queue on the busy timeout instead.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # A read (the API's documents, a long-poll's status check) begins deferred: in WAL
        # mode it reads a snapshot without queueing behind writers, whose busy-timeout
        # backoff gave long-polls answers seconds late in embedded mode.
        readonly = connection.get_execution_options().get(READ_ONLY, False)
        connection.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")


def postgres_driver(s: Session) -> psycopg.Connection[Any] | None:
    """The psycopg connection under the session's transaction, on Postgres (else None).

    The judging hot path runs constant SQL there (drcredit.storage.repository, bulk):
    psycopg prepares each statement once per connection, and SQLAlchemy's per-statement
    work, several times a round trip's CPU, is skipped. The statements join the
    session's transaction, which the session commits.
    """
    conn = s.connection()
    if conn.dialect.name != "postgresql":
        return None
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    return driver


class Database:
    """One engine and its sessions; ``session()`` commits on success, rolls back on error."""

    def __init__(self, url: str, pool_size: int = 10):
        self.url = url
        self.engine = make_engine(url, pool_size)
        self._factory = sessionmaker(self.engine, expire_on_commit=False)
        self._read_factory = sessionmaker(self.engine.execution_options(**{READ_ONLY: True}), expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._transaction(self._factory) as session:
            yield session

    @contextmanager
    def read_session(self) -> Iterator[Session]:
        """A session for reads only: on SQLite it reads a snapshot without taking the
        write lock (a write in it would take the lock late and may fail as locked)."""
        with self._transaction(self._read_factory) as session:
            yield session

    @staticmethod
    @contextmanager
    def _transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
        session = factory()
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    def dispose(self) -> None:
        self.engine.dispose()


def is_lock_conflict(exc: BaseException) -> bool:
    """A transaction the server aborted to break a deadlock or a serialization conflict.

    Nothing of it was committed, so running it again is safe.
    """
    orig = getattr(exc, "orig", None)
    return isinstance(orig, (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure))


def is_connection_error(exc: BaseException) -> bool:
    """The database could not be reached or the connection broke (it may come back)."""
    if isinstance(exc, OperationalError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, psycopg.OperationalError)


def retry_lock_conflicts(transaction: Callable[..., T], *args: Any) -> T:
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


def rows_changed(s: Session, statement: Any) -> int:
    """Rows an UPDATE or DELETE changed: conditional updates are how units claim transitions."""
    return int(s.connection().execute(statement).rowcount)


def insert_for(s: Session, table: Any) -> postgresql.Insert | sqlite.Insert:
    """An INSERT into ``table`` in the session's dialect, for its ON CONFLICT clauses
    (PostgreSQL's and SQLite's have the same ones: the code runs on both)."""
    if s.get_bind().dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(value: datetime) -> datetime:
    """A stored timestamp as UTC (SQLite hands them back without a zone)."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)
