"""Bad days of the distributed pipeline: the judge going away, a fresh database.

Real API and worker processes, real Postgres and Redis, the scripted judge over HTTP,
compared with embedded mode on the same groups.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.distributed.test_distributed import (
    COUNTED,
    assert_same_advantages,
    batch_advantages,
    embedded_reference,
    judgments_done,
    redis_db,
    request_key,
    slow_marker,
    wait_for,
    worker_env,
)
from tests.support.api import api_client
from tests.support.infra import postgres_database
from tests.support.judge_server import running_judge
from tests.support.live import free_port
from tests.support.services import Workers
from tests.support.workload import marker_group

pytestmark = pytest.mark.infra


def test_a_judge_down_mid_batch_is_waited_for_and_every_group_ends_exact(tmp_path: Path, pg_url: str) -> None:
    """The judge's server stops mid-batch (connections refused) and starts again 6 s later:
    the group status says it waits for the judge and since when, /readyz reports the judge
    down while staying ready, and every group ends as with a healthy judge, with no
    judgment failed and no judgment asked twice beyond the requests the outage cut off."""
    groups = [marker_group(seed, f"o{seed}", rollouts=4, max_turns=8) for seed in range(20, 24)]
    ids = [g["group_id"] for g in groups]
    with running_judge(slow_marker(0.1)) as judge, redis_db() as broker:
        workers = Workers(worker_env(pg_url, broker, judge.url, judge_outage_deadline_s=120, **COUNTED), tmp_path)
        try:
            workers.start("visit_judge,snippet_matcher,credit_aggregator", 8)
            workers.start("visit_judge,snippet_matcher,credit_aggregator", 8)
            with api_client(pg_url, judge.url, broker_url=broker, auto_migrate=False, **COUNTED) as client:
                assert client.post("/v1/batches", json={"batch_id": "outage", "groups": groups}).status_code == 202
                wait_for(lambda: judgments_done(client, ids) >= 15)
                judge.down()

                def waiting() -> list[dict[str, Any]]:
                    statuses = [client.get(f"/v1/groups/{g}").json() for g in ids]
                    return [s["waiting_for_judge"] for s in statuses if s["waiting_for_judge"]]

                wait_for(lambda: bool(waiting()), timeout=30)
                assert all(w["since"] and w["reason"] for w in waiting())
                ready = client.get("/readyz")
                assert ready.status_code == 200 and ready.json()["judge"]["state"] == "down"
                assert ready.json()["judge"]["endpoints"][0]["endpoint"] == judge.url
                time.sleep(6)
                judge.up()
                got = batch_advantages(client, "outage", timeout=180)
                statuses = [client.get(f"/v1/groups/{g}").json() for g in ids]
                assert client.get("/readyz").json()["judge"]["state"] == "up"
                credits = [client.get(f"/v1/groups/{g}/credits").json() for g in ids]
        finally:
            workers.stop_all()
        calls = list(judge.calls)
    assert all(s["status"] == "done" and s["waiting_for_judge"] is None for s in statuses)
    assert all(s["progress"]["judgments_failed"] == 0 for s in statuses)
    judgments = [j for doc in credits for r in doc["rollouts"] for t in r["turns"] for j in t["judgments"]]
    assert judgments and all(j["status"] != "failed" for j in judgments)
    # Attempts the outage cut off are recorded, and none of them spent the judgment.
    cut = [j for j in judgments if any(a["outcome"] == "connection" for a in j["attempts"])]
    assert cut and all(j["attempts"][-1]["outcome"] == "ok" for j in cut)
    with running_judge(slow_marker(0.0)) as reference_judge:
        want = embedded_reference(tmp_path, reference_judge, groups, **COUNTED)
        expected = Counter(request_key(c) for c in reference_judge.calls)
    assert_same_advantages(got, want)
    # Requests in flight when the server stopped may have reached it unanswered; at most
    # the judge slots of the two workers.
    extra = Counter(request_key(c) for c in calls) - expected
    assert sum(extra.values()) <= 16, extra


def test_a_judge_down_past_the_deadline_fails_the_groups_with_the_reason(tmp_path: Path, pg_url: str) -> None:
    groups = [marker_group(seed, f"d{seed}", rollouts=3, max_turns=6) for seed in range(30, 32)]
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with redis_db() as broker:
        workers = Workers(worker_env(pg_url, broker, dead, judge_outage_deadline_s=4), tmp_path)
        try:
            workers.start("visit_judge,snippet_matcher,credit_aggregator", 8)
            with api_client(pg_url, dead, broker_url=broker, auto_migrate=False) as client:
                assert client.post("/v1/batches", json={"batch_id": "dead", "groups": groups}).status_code == 202
                r = client.get("/v1/batches/dead/advantages", params={"wait": 90})
                statuses = [client.get(f"/v1/groups/{g['group_id']}").json() for g in groups]
        finally:
            workers.stop_all()
    assert r.status_code == 200 and r.json()["status"] == "failed"
    for status in statuses:
        assert status["status"] == "failed"
        assert "unreachable" in status["error"] and "outage deadline" in status["error"]
        assert status["progress"]["judgments_failed"] == 0  # an outage is not a failed judgment


def _serve(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    cli = [sys.executable, "-m", "drcredit_cli.main", "serve", "--port", str(port)]
    return subprocess.Popen(cli, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def test_a_fresh_database_with_two_apis_and_two_workers_started_at_once(tmp_path: Path) -> None:
    """No `db upgrade`: every process migrates at start-up, one at a time under the
    advisory lock, and a batch scores exactly as in embedded mode."""
    groups = [marker_group(seed, f"f{seed}", rollouts=3, max_turns=6) for seed in range(40, 43)]
    with postgres_database("drcredit_fresh") as url, running_judge(slow_marker(0.0)) as judge, redis_db() as broker:
        env = worker_env(url, broker, judge.url)
        workers = Workers(env, tmp_path)
        ports = [free_port(), free_port()]
        apis: list[subprocess.Popen[bytes]] = []
        try:
            for queues in ("visit_judge,snippet_matcher,credit_aggregator",) * 2:
                workers.start(queues, 4, wait=False)
            apis = [_serve(env, port, tmp_path / f"api-{port}.log") for port in ports]
            first, second = (f"http://127.0.0.1:{port}" for port in ports)

            def ready() -> bool:
                try:
                    return all(httpx.get(f"{u}/readyz").status_code == 200 for u in (first, second))
                except httpx.TransportError:
                    return False

            wait_for(ready, timeout=60, interval=0.2)
            r = httpx.post(f"{first}/v1/batches", json={"batch_id": "fresh", "groups": groups}, timeout=60)
            assert r.status_code == 202, r.text
            r = httpx.get(f"{second}/v1/batches/fresh/advantages", params={"wait": 120}, timeout=130)
            assert r.status_code == 200, r.text
            got = {g["group_id"]: g for g in r.json()["groups"]}
            assert all(p.poll() is None for p in workers.processes), workers.logs()
        finally:
            for api in apis:
                api.terminate()
                api.wait(20)
            workers.stop_all()
        logs = "".join((tmp_path / f"api-{p}.log").read_text() for p in ports) + workers.logs()
        judge.calls.clear()
        want = embedded_reference(tmp_path, judge, groups)
    assert "Traceback" not in logs, logs[-3000:]
    assert_same_advantages(got, want)


def test_an_api_on_a_schema_behind_answers_503_naming_the_upgrade(tmp_path: Path) -> None:
    with postgres_database("drcredit_behind") as url, redis_db() as broker:
        with api_client(url, None, broker_url=broker, auto_migrate=False) as client:
            ready = client.get("/readyz")
            assert ready.status_code == 503 and "drcredit db upgrade" in ready.json()["schema"]
            for method, path in (("GET", "/v1/groups/x"), ("POST", "/v1/groups")):
                r = client.request(method, path, json={})
                assert r.status_code == 503 and "drcredit db upgrade" in r.json()["message"], r.text
                assert int(r.headers["retry-after"]) > 0
        assert os.environ.get("DRCREDIT_AUTO_MIGRATE") is None
