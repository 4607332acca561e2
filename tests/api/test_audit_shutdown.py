"""An embedded audit stops with its process: a judge that never answers holds neither the
service's shutdown nor its threads, the audit is not failed for it, and the next start
runs it again."""

from __future__ import annotations

import socket
import threading
import time
from datetime import UTC, datetime

from sqlalchemy import select

from drcredit.storage import models as m
from drcredit.storage.database import Database
from tests.api.test_audits import scored, three_rollouts
from tests.support.api import api_client
from tests.support.judge_server import JudgeServer


def test_an_audit_waiting_on_its_judge_does_not_hold_the_shutdown_and_runs_at_the_next_start(
    database_url: str, marker_judge: JudgeServer
) -> None:
    # A judge that takes requests in and never answers: the audit stays running.
    with socket.create_server(("127.0.0.1", 0), backlog=64) as silent:
        held = {"base_url": f"http://127.0.0.1:{silent.getsockname()[1]}/v1", "model": "judge-h", "timeout_s": 3600}
        before = {t.name for t in threading.enumerate()}
        with api_client(database_url, marker_judge.url, audit_judges={"held": held}, api_keys="alice:ka") as client:
            client.headers["Authorization"] = "Bearer ka"
            scored(client, three_rollouts("g1", 1))
            r = client.post("/v1/audits", json={"judge": "held", "scope": {"group_ids": ["g1"]}})
            assert r.status_code == 202, r.text
            audit_id = r.json()["audit_id"]
            deadline = time.monotonic() + 30
            while client.get(f"/v1/audits/{audit_id}").json()["status"] != "running":
                assert time.monotonic() < deadline
                time.sleep(0.1)
            time.sleep(0.5)  # its calls are out, waiting on the silent judge
            closing = time.monotonic()
        shutdown_s = time.monotonic() - closing
    assert shutdown_s < 10, shutdown_s  # not the dispatcher's 60 s wait for running work
    left = {t.name for t in threading.enumerate()} - before
    assert not {n for n in left if n.startswith("drcredit-")}, left
    db = Database(database_url, 1)
    try:
        with db.session() as s:
            row = s.scalars(select(m.Audit).where(m.Audit.audit_id == audit_id)).one()
            # Not failed: running, its claim given back for the next start to take.
            assert row.status == "running" and row.error is None
            assert row.lease_expires_at is not None and row.lease_expires_at <= datetime.now(UTC)
    finally:
        db.dispose()
    # The next start runs it again, its judge answering now.
    answering = {"base_url": marker_judge.url, "model": "judge-h"}
    with api_client(database_url, marker_judge.url, audit_judges={"held": answering}, api_keys="alice:ka") as client:
        client.headers["Authorization"] = "Bearer ka"
        done = client.get(f"/v1/audits/{audit_id}", params={"wait": 60})
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "done" and done.json()["group_ids"] == ["g1"]
