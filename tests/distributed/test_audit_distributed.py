"""A judge audit in distributed mode: run by the auditor beside a batch being scored.

The audit judge and the main judge are one server here, with room for one call at a
time (``max_concurrency`` 1): the audit judge shares the main judge's queue for it, and
every call the server sees says which judge made it (its model). Training calls go
first: once the batch's calls wait, the audit's wait behind them; the batch's advantages
are those of embedded mode.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.distributed.test_distributed import (
    assert_same_advantages,
    batch_advantages,
    embedded_reference,
    redis_db,
    slow_marker,
    wait_for,
    worker_env,
)
from tests.support.api import api_client
from tests.support.judge_server import running_judge
from tests.support.services import Workers
from tests.support.workload import marker_group

pytestmark = pytest.mark.infra


def test_an_audit_beside_a_batch_waits_for_training_calls_and_changes_nothing(tmp_path: Path, pg_url: str) -> None:
    audited = [marker_group(seed, f"a{seed}", rollouts=4, max_turns=6) for seed in range(200, 203)]
    training = [marker_group(seed, f"t{seed}", rollouts=4, max_turns=6) for seed in range(210, 214)]
    with running_judge(slow_marker(0.03)) as judge, redis_db() as broker:
        one_at_a_time = json.dumps([{"url": judge.url, "max_concurrency": 1}])
        audit_judges = json.dumps({"second": {"base_url": one_at_a_time, "model": "judge-audit"}})
        env = worker_env(pg_url, broker, one_at_a_time, judge_concurrency=2, audit_judges=audit_judges)
        workers = Workers(env, tmp_path)
        try:
            workers.start("visit_judge,snippet_matcher,credit_aggregator,auditor", None)
            with api_client(
                pg_url, one_at_a_time, broker_url=broker, auto_migrate=False, audit_judges=json.loads(audit_judges)
            ) as client:
                assert client.post("/v1/batches", json={"batch_id": "first", "groups": audited}).status_code == 202
                batch_advantages(client, "first")
                started = client.post("/v1/audits", json={"judge": "second", "scope": {"batch_id": "first"}})
                assert started.status_code == 202, started.text
                audit_id = started.json()["audit_id"]
                wait_for(lambda: sum(c.request["model"] == "judge-audit" for c in judge.calls) >= 5, timeout=60)
                posted_at = time.monotonic()
                assert client.post("/v1/batches", json={"batch_id": "second", "groups": training}).status_code == 202
                got = batch_advantages(client, "second", timeout=180)
                report = client.get(f"/v1/audits/{audit_id}", params={"wait": 180})
                assert report.status_code == 200, report.text
        finally:
            workers.stop_all()
        calls = [(c.received_at, c.request["model"]) for c in judge.calls]
    train = sorted(t for t, model in calls if model == "judge-test" and t >= posted_at)
    first, last = train[0], train[-1]
    interleaved = [t for t, model in calls if model == "judge-audit" and first < t < last]
    # One audit call may be in flight when the batch's first call waits, and one more may
    # take the place in a moment when every waiting chain is storing its answer.
    assert len(interleaved) <= 2, (len(interleaved), len(train))
    assert report.json()["agreement"]["visit"]["exact"] == 1.0
    with running_judge(slow_marker(0.0)) as reference_judge:
        want = embedded_reference(tmp_path, reference_judge, training)
    assert_same_advantages(got, want)
