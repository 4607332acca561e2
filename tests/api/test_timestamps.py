"""Every time the API returns is ISO 8601 in UTC, ``+00:00`` (docs/api.md), on SQLite
(which keeps no zone) and on Postgres (which answers in its session's zone).

The test walks every document of a scored batch, a run, an audit, a group that waited for
its judge and ``/readyz``, and checks each value that reads as a time, wherever it stands.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Column, Integer, MetaData, Table, create_engine, event, insert, select, text

from drcredit.storage.types import UTCDateTime, as_utc
from tests.api.test_audits import audited, marker_answer_reply, scored, three_rollouts
from tests.support.api import api_client
from tests.support.infra import postgres_database
from tests.support.judge_server import JudgeServer, running_judge

#: A value that reads as a time: a date, "T" and at least hours and minutes.
TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}")


def times_in(doc: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(where, value) of every string in ``doc`` that reads as a time."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from times_in(value, f"{path}.{key}")
    elif isinstance(doc, list):
        for k, value in enumerate(doc):
            yield from times_in(value, f"{path}[{k}]")
    elif isinstance(doc, str) and TIME.match(doc):
        yield path, doc


def field(where: str) -> str:
    """The last key of a path: ``.groups[0].created_at`` -> ``created_at``."""
    return re.sub(r"\[\d+\]", "", where).rsplit(".", 1)[-1]


def got(client: TestClient, path: str, **params: Any) -> Any:
    r = client.get(path, params=params)
    assert r.status_code == 200, (path, r.text)
    return r.json()


@pytest.fixture
def client(database_url: str, marker_judge: JudgeServer) -> Iterator[TestClient]:
    with running_judge(marker_answer_reply) as same:
        judges = {"same": {"base_url": same.url, "model": "judge-test"}}
        # Answers reused within a group only: the group that waits for its judge asks what
        # the batch's groups asked, and must reach the judge rather than the reuse store.
        with api_client(
            database_url, marker_judge.url, audit_judges=judges, api_keys="alice:ka", judge_reuse="group"
        ) as c:
            c.headers["Authorization"] = "Bearer ka"
            yield c


def test_every_time_the_api_returns_is_utc_with_its_offset(client: TestClient, marker_judge: JudgeServer) -> None:
    before = datetime.now(UTC) - timedelta(seconds=1)
    batch = {"batch_id": "b1", "groups": [three_rollouts("g1", 1), three_rollouts("g2", 1)]}
    assert client.post("/v1/batches", json=batch).status_code == 202
    got(client, "/v1/batches/b1/advantages", wait=60)
    audit = audited(client, {"judge": "same", "scope": {"run": "exp"}})
    assert audit["status"] == "done", audit
    item = got(client, "/v1/labels/queue", run="exp", labeler="ann", n=1)["items"][0]
    label = client.post("/v1/labels", json={"item_id": item["item_id"], "value": 1, "labeler": "ann"})
    assert label.status_code == 201, label.text

    # A group whose judge is down waits for it, and says since when.
    marker_judge.down()
    try:
        assert client.post("/v1/groups", json=three_rollouts("late", 2)).status_code == 202
        deadline = time.monotonic() + 60
        while not (waiting := got(client, "/v1/groups/late"))["waiting_for_judge"]:
            assert time.monotonic() < deadline, waiting
            time.sleep(0.2)
        ready_while_down = client.get("/readyz").json()
    finally:
        marker_judge.up()
    scored(client, three_rollouts("late", 2))

    documents = {
        "group": got(client, "/v1/groups/g1"),
        "group waiting for its judge": waiting,
        "group after the wait": got(client, "/v1/groups/late"),
        "advantages": got(client, "/v1/groups/g1/advantages"),
        "credits": got(client, "/v1/groups/g1/credits"),
        "batch": got(client, "/v1/batches/b1"),
        "batch advantages": got(client, "/v1/batches/b1/advantages"),
        "evidence": got(client, "/v1/groups/g1/evidence"),
        "sensitivity": got(client, "/v1/batches/b1/sensitivity"),
        "runs": got(client, "/v1/runs"),
        "run": got(client, "/v1/runs/exp"),
        "audits": got(client, "/v1/audits"),
        "audit": got(client, f"/v1/audits/{audit['audit_id']}"),
        "label given": label.json(),
        "labels": got(client, "/v1/labels"),
        "readyz while the judge was down": ready_while_down,
        "readyz": client.get("/readyz").json(),
    }
    found = {name: list(times_in(doc)) for name, doc in documents.items()}
    wrong = [
        (name, where, value) for name, times in found.items() for where, value in times if not value.endswith("+00:00")
    ]
    assert not wrong, wrong
    # Every time is a real one, of this test.
    now = datetime.now(UTC)
    for name, times in found.items():
        for where, value in times:
            assert before <= datetime.fromisoformat(value) <= now, (name, where, value)
    # The walk saw the times each document is known to carry (a check that cannot miss them).
    fields = {name: {field(where) for where, _ in times} for name, times in found.items()}
    assert {"created_at", "started_at", "finished_at"} <= fields["group"]
    assert {"created_at", "started_at", "since"} <= fields["group waiting for its judge"]
    assert {"created_at", "started_at", "finished_at"} <= fields["batch"]
    assert {"first_at", "last_at"} <= fields["runs"]
    assert {"created_at", "started_at", "finished_at"} <= fields["audits"] & fields["audit"]
    assert {"created_at", "updated_at"} <= fields["labels"] & fields["label given"]
    assert "since" in fields["readyz while the judge was down"]


def test_a_stored_time_reads_back_as_the_same_instant_in_utc() -> None:
    # SQLite hands a stored time back naive: it was stored as UTC.
    naive = as_utc(datetime(2026, 11, 26, 8, 51, 41, 932888))
    assert naive.isoformat() == "2026-11-26T08:51:41.932888+00:00"
    # Postgres hands it back in the session's zone: the same instant, in UTC.
    paris = as_utc(datetime(2026, 11, 26, 9, 51, 41, tzinfo=timezone(timedelta(hours=1))))
    assert paris.isoformat() == "2026-11-26T08:51:41+00:00"


def test_postgres_in_another_session_zone_still_reads_utc() -> None:
    """The column type against Postgres, its session in Asia/Kolkata (+05:30)."""
    with postgres_database() as url:
        engine = create_engine(url)

        @event.listens_for(engine, "connect")
        def zone(dbapi_connection: Any, _: Any) -> None:
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SET TIME ZONE 'Asia/Kolkata'")

        table = Table("stamps", MetaData(), Column("id", Integer, primary_key=True), Column("at", UTCDateTime()))
        try:
            table.create(engine)
            stamp = datetime(2026, 11, 26, 8, 51, 41, 932888, tzinfo=UTC)
            with engine.begin() as conn:
                conn.execute(insert(table).values(id=1, at=stamp))
                raw = conn.execute(text("SELECT at::text FROM stamps")).scalar_one()
                at = conn.execute(select(table.c.at)).scalar_one()
            assert raw == "2026-11-26 14:21:41.932888+05:30"  # what the session sees
            assert at.isoformat() == "2026-11-26T08:51:41.932888+00:00"
        finally:
            engine.dispose()
