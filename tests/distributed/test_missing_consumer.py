"""A queue that no worker consumes is reported, not silent: in the group's status, its
409, ``/readyz`` and ``/metrics``; and the report ends when a worker for it starts.

Real API (in this process), real worker processes, real Postgres and Redis.
"""

from __future__ import annotations

import re
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from drcredit.client import DrCreditClient
from drcredit.client.errors import DrCreditTimeout
from drcredit_api.app import create_app
from tests.distributed.test_distributed import redis_db, worker_env
from tests.pipeline.test_outcome_judging import judged_group
from tests.support.api import api_client, settings_for
from tests.support.judge_server import JudgeServer
from tests.support.live import serving
from tests.support.services import Workers

pytestmark = pytest.mark.infra

#: Short records, so that a killed worker is reported quickly.
TTL_S = 3.0


def metric(client: TestClient, name: str, queue: str) -> float:
    text = client.get("/metrics").text
    found = re.search(rf'^{name}\{{queue="{queue}"\}} (\S+)$', text, re.MULTILINE)
    assert found, f"{name}{{queue={queue}}} not in /metrics"
    return float(found.group(1))


def queues_of(client: TestClient) -> dict[str, Any]:
    r = client.get("/readyz")
    assert r.status_code == 200, r.text  # the API stays ready to ingest
    assert r.json()["status"] == "ready"
    section: dict[str, Any] = r.json()["queues"]
    return section


def seconds_until(check: Any, timeout: float = 30.0) -> float:
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, "not reported in time"
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_group_waiting_on_a_queue_without_consumer_says_so_until_one_starts(
    tmp_path: Path, pg_url: str, marker_judge: JudgeServer
) -> None:
    doc = judged_group("nobody")  # outcome_source judge: rollouts a and b have reports
    with redis_db() as broker:
        queue_client = redis.Redis.from_url(broker)
        workers = Workers(worker_env(pg_url, broker, marker_judge.url, consumer_ttl_s=TTL_S), tmp_path)
        try:
            workers.start("visit_judge,snippet_matcher,credit_aggregator,auditor", 4)
            with api_client(pg_url, marker_judge.url, broker_url=broker, auto_migrate=False) as client:
                section = queues_of(client)
                assert section["without_consumer"] == ["outcome_judge"]
                by_queue = {q["queue"]: q for q in section["by_queue"]}
                assert by_queue["outcome_judge"] == {
                    "queue": "outcome_judge",
                    "consumers": 0,
                    "messages": 0,
                    "last_consumer_seen": None,
                }
                assert by_queue["visit_judge"]["consumers"] == 1
                [worker] = section["workers"]
                assert worker["queues"] == ["visit_judge", "snippet_matcher", "credit_aggregator", "auditor"]
                assert metric(client, "drcredit_queue_consumers", "outcome_judge") == 0
                assert metric(client, "drcredit_queue_consumers", "visit_judge") == 1

                posted = datetime.now(UTC)
                assert client.post("/v1/groups", json=doc).status_code == 202
                seconds_until(lambda: client.get("/v1/groups/nobody").json()["waiting_for_consumer"] is not None)
                [wait] = client.get("/v1/groups/nobody").json()["waiting_for_consumer"]
                assert wait["queue"] == "outcome_judge"
                assert wait["units"] == 2
                since = datetime.fromisoformat(wait["since"])
                assert posted.replace(microsecond=0) <= since <= datetime.now(UTC)

                # Several sweeps later (every second here): the same wait, and the two
                # messages are not sent again and again into a queue nobody reads.
                time.sleep(4)
                status = client.get("/v1/groups/nobody").json()
                assert status["status"] == "running"  # its visit chains are done; the outcomes wait
                assert status["waiting_for_consumer"] == [wait]
                assert queue_client.llen("outcome_judge") == 2

                r = client.get("/v1/groups/nobody/advantages")
                assert r.status_code == 409
                message = r.json()["message"]
                assert "queue outcome_judge" in message and "drcredit worker --queues outcome_judge" in message
                assert queues_of(client)["groups_waiting_for_consumer"] == {"outcome_judge": 1}
                # A trainer's wait (the SDK) that runs out says why, naming the queue.
                app = create_app(settings_for(pg_url, marker_judge.url, broker_url=broker, auto_migrate=False))
                with serving(app) as url, DrCreditClient(url) as sdk, pytest.raises(DrCreditTimeout) as timed_out:
                    sdk.wait_for_advantages("nobody", timeout=1.0, poll_wait=0.5)
                assert "its work waits on outcome_judge, which no live worker consumes" in str(timed_out.value)
                assert metric(client, "drcredit_groups_waiting_for_consumer", "outcome_judge") == 1
                assert metric(client, "drcredit_queue_depth", "outcome_judge") == 2

                outcome_worker = workers.start("outcome_judge", 4)
                r = client.get("/v1/groups/nobody/advantages", params={"wait": 60})
                assert r.status_code == 200, r.text
                status = client.get("/v1/groups/nobody").json()
                assert status["status"] == "done" and status["waiting_for_consumer"] is None
                section = queues_of(client)
                assert section["without_consumer"] == []
                assert section["groups_waiting_for_consumer"] == {}
                assert metric(client, "drcredit_queue_consumers", "outcome_judge") == 1
                assert metric(client, "drcredit_groups_waiting_for_consumer", "outcome_judge") == 0

                # A worker that stops cleanly is reported at once; one that is killed when
                # its record runs out (TTL_S here, DRCREDIT_CONSUMER_TTL_S).
                outcome_worker.send_signal(signal.SIGTERM)
                stopped_after = seconds_until(lambda: queues_of(client)["without_consumer"] == ["outcome_judge"])
                outcome_worker.wait(30)
                gone = queues_of(client)["by_queue"][2]
                assert gone["queue"] == "outcome_judge" and gone["last_consumer_seen"] is not None
                killed = workers.start("outcome_judge", 4)
                seconds_until(lambda: queues_of(client)["without_consumer"] == [])
                killed.send_signal(signal.SIGKILL)
                killed_after = seconds_until(lambda: queues_of(client)["without_consumer"] == ["outcome_judge"])
        finally:
            workers.stop_all()
    assert stopped_after < 1.5
    assert killed_after < TTL_S + 1.5
    print(f"reported {stopped_after:.2f}s after a clean stop, {killed_after:.2f}s after a kill (TTL {TTL_S}s)")
