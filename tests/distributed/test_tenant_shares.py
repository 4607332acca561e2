"""Fair shares of the judge across worker processes: two tenants with weights 3:1, both
backlogged on a judge capped at 8 calls at once, served 75/25 however their groups fall
on two visit workers (each process's part of the fleet follows its demand per tenant,
shared in Redis); one tenant alone gets the whole fleet; a tenant with a burst holds its
burst weight for its allowance's seconds, then its weight.

A call's tenant is read at the judge from its group's question (each tenant's questions
start with its name).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.distributed.test_distributed import redis_db, slow_marker, worker_env
from tests.support.api import api_client
from tests.support.judge_server import JudgeServer, running_judge
from tests.support.services import Workers
from tests.support.workload import marker_group

pytestmark = pytest.mark.infra

KEYS = "a:key-a,b:key-b"
HEADERS = {t: {"Authorization": f"Bearer key-{t}"} for t in ("a", "b")}
SLOTS = 8


def tenant_groups(tenant: str, n: int) -> list[dict[str, Any]]:
    groups = []
    for seed in range(n):
        doc = marker_group(seed, f"{tenant}{seed}", rollouts=6, max_turns=8)
        doc["question"] = f"[{tenant}] {doc['question']}"
        groups.append(doc)
    return groups


def tenant_of_call(call: Any) -> str:
    return str(call.document["question"])[1]


def served_share(judge: JudgeServer, tenant: str, start: float, end: float) -> tuple[float, int]:
    calls = [c for c in judge.calls if start <= c.received_at < end]
    mine = sum(1 for c in calls if tenant_of_call(c) == tenant)
    return (mine / len(calls) if calls else 0.0), len(calls)


@contextmanager
def tenants_deployment(tmp_path: Path, pg_url: str, tenants: str) -> Iterator[tuple[JudgeServer, TestClient]]:
    """A judge of SLOTS places answering in 0.2 s, two visit workers and one for the rest,
    and the API, every process with the keys and ``tenants``: the judge and an API client."""
    with running_judge(slow_marker(0.2)) as judge, redis_db() as broker:
        fleet = json.dumps([{"url": judge.url, "max_concurrency": SLOTS}])
        env = worker_env(pg_url, broker, fleet, judge_concurrency=1024, api_keys=KEYS, tenants=tenants)
        workers = Workers(env, tmp_path)
        try:
            workers.start("visit_judge", 16)
            workers.start("visit_judge", 16)
            workers.start("snippet_matcher,credit_aggregator", 8)
            with api_client(
                pg_url, fleet, broker_url=broker, auto_migrate=False, api_keys=KEYS, tenants=tenants
            ) as client:
                yield judge, client
        finally:
            workers.stop_all()


def test_weights_hold_across_worker_processes(tmp_path: Path, pg_url: str) -> None:
    tenants = '{"a": {"weight": 3}, "b": {"weight": 1}}'
    with tenants_deployment(tmp_path, pg_url, tenants) as (judge, client):
        posted = time.monotonic()
        for tenant in ("a", "b"):
            body = {"batch_id": f"step-{tenant}", "groups": tenant_groups(tenant, 14)}
            assert client.post("/v1/batches", json=body, headers=HEADERS[tenant]).status_code == 202
        for tenant in ("a", "b"):
            r = client.get(f"/v1/batches/step-{tenant}/advantages", params={"wait": 240}, headers=HEADERS[tenant])
            assert r.status_code == 200, r.text
        usage = {t: client.get("/v1/usage", headers=HEADERS[t]).json() for t in ("a", "b")}
    a_calls = [c.received_at for c in judge.calls if tenant_of_call(c) == "a"]
    b_calls = [c.received_at for c in judge.calls if tenant_of_call(c) == "b"]
    # Both backlogged from the first seconds until a's last calls: a's work is three
    # times b's rate, so a ends first; the steady part leaves out the start and a's tail.
    start, end = posted + 3.0, max(a_calls) - 2.0
    assert end - start > 6, f"too short a stretch with both backlogged: {end - start:.1f}s"
    share, n = served_share(judge, "a", start, end)
    assert 0.65 <= share <= 0.85, f"a served {share:.2f} of {n} calls while both waited"
    # Every 4 s of it, within 15 points (fewer calls per window: more noise).
    t = start
    while t + 4 <= end:
        window, count = served_share(judge, "a", t, t + 4)
        assert 0.60 <= window <= 0.90, f"a served {window:.2f} of {count} calls in [{t - posted:.0f}s, +4s)"
        t += 4
    # After a is done, b alone gets the whole fleet: its pace rises to the cap's.
    alone = [x for x in b_calls if x > max(a_calls) + 1.0]
    if len(alone) > 40:
        pace_alone = len(alone) / (max(alone) - min(alone))
        pace_shared = sum(1 for x in b_calls if start <= x < end) / (end - start)
        assert pace_alone > 2.5 * pace_shared, (pace_alone, pace_shared)
    assert usage["a"]["day"]["calls"] >= len(a_calls) and usage["b"]["day"]["calls"] >= len(b_calls)


def test_a_bursting_tenant_holds_its_burst_weight_then_its_weight(tmp_path: Path, pg_url: str) -> None:
    """b (weight 1, a burst of weight 7 for 5 s) posts 2 s after a (weight 1): b is
    served 7/8 of the calls while its burst lasts, then half (both still backlogged)."""
    tenants = '{"a": {"weight": 1}, "b": {"weight": 1, "burst": {"weight": 7, "seconds": 5}}}'
    with tenants_deployment(tmp_path, pg_url, tenants) as (judge, client):
        posted = {}
        for tenant in ("a", "b"):
            body = {"batch_id": f"burst-{tenant}", "groups": tenant_groups(tenant, 10)}
            posted[tenant] = time.monotonic()
            assert client.post("/v1/batches", json=body, headers=HEADERS[tenant]).status_code == 202
            if tenant == "a":
                time.sleep(2.0)
        for tenant in ("a", "b"):
            r = client.get(f"/v1/batches/burst-{tenant}/advantages", params={"wait": 240}, headers=HEADERS[tenant])
            assert r.status_code == 200, r.text
    last = {t: max(c.received_at for c in judge.calls if tenant_of_call(c) == t) for t in ("a", "b")}
    # b's busy spell, and its burst, begin with its first call: on a loaded machine well
    # after its POST (its groups stored, their units claimed).
    b_first = min(c.received_at for c in judge.calls if tenant_of_call(c) == "b")
    assert b_first - posted["b"] < 5.0, f"b's first call came {b_first - posted['b']:.1f}s after its POST"
    # The burst: from b's first report (well under a second after its first call) to
    # half a second before the end of its 5 s.
    burst, n = served_share(judge, "b", b_first + 1.0, b_first + 4.5)
    assert burst >= 0.72, f"b served {burst:.2f} of {n} calls in its burst (weight 7 of 8: 0.875)"
    # Spent: an even split while both wait (from 2 s past its end to 2 s before either ends).
    start, end = b_first + 7.0, min(last.values()) - 2.0
    assert end - start > 4, f"too short a stretch with both backlogged after the burst: {end - start:.1f}s"
    even, n = served_share(judge, "b", start, end)
    assert 0.35 <= even <= 0.65, f"b served {even:.2f} of {n} calls after its burst (weight 1 of 2)"
