"""The pool pings a connection only after it sat idle, and replaces one that died meanwhile."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.exc import OperationalError

from drcredit.storage import database
from drcredit.storage.database import Database
from tests.support.infra import postgres_database


def _backend_pid(db: Database) -> int:
    with db.session() as s:
        return int(s.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(url: str, pid: int) -> None:
    """End one server backend from another connection, as a database restart would."""
    admin = create_engine(url)
    try:
        with admin.begin() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar_one()
    finally:
        admin.dispose()


def _count_pings(db: Database) -> Callable[[], int]:
    pings: list[str] = []
    real_ping = db.engine.dialect.do_ping

    def counting_ping(dbapi_connection: object) -> bool:
        pings.append("ping")
        return bool(real_ping(dbapi_connection))

    db.engine.dialect.do_ping = counting_ping  # type: ignore[method-assign]
    return lambda: len(pings)


@contextmanager
def _one_connection_pool(monkeypatch: pytest.MonkeyPatch, ping_after_idle_s: float) -> Iterator[tuple[Database, str]]:
    """A pool of one connection on a fresh Postgres database, pinging after this idle time."""
    monkeypatch.setattr(database, "PING_AFTER_IDLE_S", ping_after_idle_s)
    with postgres_database("drcredit_pool") as url:
        db = Database(url, 1)
        try:
            yield db, url
        finally:
            db.dispose()


def test_a_connection_idle_past_the_threshold_that_died_is_replaced_without_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _one_connection_pool(monkeypatch, 0.2) as (db, url):
        first = _backend_pid(db)
        _terminate(url, first)
        time.sleep(0.3)
        # The pooled connection is dead; its idle time earns it a ping, the ping fails
        # and the pool hands out a new connection: the transaction never sees the loss.
        second = _backend_pid(db)
        assert second != first


def test_a_connection_back_at_work_at_once_is_not_pinged_and_a_loss_meanwhile_fails_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with _one_connection_pool(monkeypatch, 30.0) as (db, url):
        pings = _count_pings(db)
        checkouts: list[int] = []
        event.listen(db.engine, "checkout", lambda *_: checkouts.append(1))
        first = _backend_pid(db)
        for _ in range(5):
            assert _backend_pid(db) == first
        assert len(checkouts) == 6 and pings() == 0
        # Within the idle window a lost connection fails its transaction, as one in
        # flight would; the disconnect invalidates the pool and the next one reconnects.
        _terminate(url, first)
        with pytest.raises(OperationalError):
            _backend_pid(db)
        assert _backend_pid(db) != first
