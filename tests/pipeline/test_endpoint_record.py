"""The judge endpoint's recorded state when several writers notice its first outage at
once (on SQLite and Postgres): one row, counted as one outage, and no writer fails (the
one that lost the race to insert the row used to fail, and the groups' ``waiting_for_judge``
it carried was never written)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from drcredit.judges.breaker import BreakerState
from drcredit.scoring.work.outages import endpoint_states, record_endpoint
from drcredit.storage.database import Database
from drcredit.storage.migrate import upgrade


def test_writers_noticing_a_first_outage_at_once_record_one_row_and_all_succeed(database_url: str) -> None:
    upgrade(database_url)
    db = Database(database_url, 8)
    since = datetime(2026, 11, 27, 1, 0, tzinfo=UTC)
    down = BreakerState("http://judge.test/v1", False, since, "connection refused", 1)
    writers = 6
    start = threading.Barrier(writers)
    failures: list[BaseException] = []

    def write() -> None:
        try:
            start.wait()
            with db.session() as s:
                record_endpoint(s, down)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            failures.append(exc)

    try:
        threads = [threading.Thread(target=write) for _ in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        with db.session() as s:
            states = endpoint_states(s)
        assert [(e["endpoint"], e["state"], e["reason"], e["outages"]) for e in states] == [
            ("http://judge.test/v1", "down", "connection refused", 1)
        ]
    finally:
        db.dispose()
