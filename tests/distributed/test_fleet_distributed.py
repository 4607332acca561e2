"""The judge fleet in distributed mode: worker processes on Postgres and Redis against the
judges users run: two replicas with one killed mid-batch, a rate-limited judge, a small
server without keep-alive, a slow replica, and what one worker learned reused by the next.

Every case compares the advantages with embedded mode on the same groups and judge script.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from drcredit.judges.fleet import limits
from drcredit.judges.fleet.store import EndpointRecord, RedisStore
from tests.distributed.test_distributed import (
    COUNTED,
    assert_same_advantages,
    batch_advantages,
    embedded_reference,
    redis_db,
    request_key,
    slow_marker,
    wait_for,
    worker_env,
)
from tests.judges.test_judge_warm_up import FactsServer
from tests.support.api import api_client
from tests.support.judge_server import RateLimit, judge_process, running_judge
from tests.support.live import LiveServer
from tests.support.services import Workers
from tests.support.workload import marker_group

pytestmark = pytest.mark.infra

#: Plain workers: the fleet learns its limits (no judge concurrency set).
# Calls are counted against the embedded reference: answers reused within a group only.
PLAIN = {"judge_concurrency": 1024, **COUNTED}


def reference(tmp_path: Path, groups: list[dict[str, Any]]) -> tuple[dict[str, Any], Counter[str]]:
    with running_judge(slow_marker(0.0)) as judge:
        want = embedded_reference(tmp_path, judge, groups, **COUNTED)
        return want, Counter(request_key(c) for c in judge.calls)


def failed_judgments(client: Any, group_ids: list[str]) -> int:
    return sum(client.get(f"/v1/groups/{g}").json()["progress"]["judgments_failed"] for g in group_ids)


def run_batch(client: Any, batch_id: str, groups: list[dict[str, Any]], timeout: float = 180) -> dict[str, Any]:
    assert client.post("/v1/batches", json={"batch_id": batch_id, "groups": groups}).status_code == 202
    return batch_advantages(client, batch_id, timeout=timeout)


def test_two_replicas_one_killed_mid_batch(tmp_path: Path, pg_url: str) -> None:
    groups = [marker_group(seed, f"kr{seed}", rollouts=4, max_turns=8) for seed in range(60, 66)]
    ids = [g["group_id"] for g in groups]
    with judge_process(tmp_path, delay=0.15) as a, judge_process(tmp_path, delay=0.15) as b, redis_db() as broker:
        fleet = f"{a.url},{b.url}"
        workers = Workers(worker_env(pg_url, broker, fleet, **PLAIN), tmp_path)
        try:
            workers.start("visit_judge", 8)
            workers.start("snippet_matcher,credit_aggregator", 4)
            with api_client(pg_url, fleet, broker_url=broker, auto_migrate=False) as client:
                client.post("/v1/batches", json={"batch_id": "kill", "groups": groups})
                wait_for(lambda: len(a.calls()) + len(b.calls()) >= 60)
                served_before = (len(a.calls()), len(b.calls()))
                a.kill()
                got = batch_advantages(client, "kill", timeout=180)
                failed = failed_judgments(client, ids)
                credits = [client.get(f"/v1/groups/{g}/credits").json() for g in ids]
                ready = client.get("/readyz").json()["judge"]
        finally:
            workers.stop_all()
        served = a.calls() + b.calls()
    want, expected = reference(tmp_path, groups)
    assert_same_advantages(got, want)
    assert failed == 0
    # Each served 30-70% before the kill.
    assert 0.3 <= served_before[0] / sum(served_before) <= 0.7, served_before
    attempts = [
        t
        for doc in credits
        for r in doc["rollouts"]
        for tr in r["turns"]
        for j in tr["judgments"]
        for t in j["attempts"]
    ]
    cut = [t for t in attempts if t["outcome"] == "connection" and t["endpoint"] == a.url]
    assert cut and not any(t["spent"] for t in cut)
    # Nothing asked twice beyond the calls the kill cut off.
    extra = Counter(served) - expected
    assert sum(extra.values()) <= len(cut), (extra, len(cut))
    assert {e["endpoint"]: e["state"] for e in ready["endpoints"]}[a.url] in ("down", "mixed")
    assert ready["state"] == "degraded"


def test_a_rate_limited_judge_fails_nothing_and_few_429s(tmp_path: Path, pg_url: str) -> None:
    groups = [marker_group(seed, f"rl{seed}", rollouts=4, max_turns=8) for seed in range(70, 76)]
    ids = [g["group_id"] for g in groups]
    quota = RateLimit(per_s=40, burst=40, headers=False)
    with running_judge(slow_marker(0.05), rate=quota) as judge, redis_db() as broker:
        workers = Workers(worker_env(pg_url, broker, judge.url, **PLAIN), tmp_path)
        try:
            workers.start("visit_judge", 8)
            workers.start("visit_judge,snippet_matcher,credit_aggregator", 8)
            with api_client(pg_url, judge.url, broker_url=broker, auto_migrate=False) as client:
                got = run_batch(client, "rl", groups)
                failed = failed_judgments(client, ids)
                endpoint = client.get("/readyz").json()["judge"]["endpoints"][0]
        finally:
            workers.stop_all()
        served, refused = len(judge.calls), judge.rate_limited
    want, _ = reference(tmp_path, groups)
    assert_same_advantages(got, want)
    assert failed == 0
    # Bounded: the first round (the initial limit, before anything is known) beyond the
    # quota's burst of 40, and then the probes above the inferred pace.
    assert refused <= max(0, limits.INITIAL_LIMIT - 40) + 0.15 * served, (refused, served)
    assert endpoint["rate_source"] == "inferred" and endpoint["rate_limited"] == refused


def test_a_server_that_queues_is_learned_and_shown_in_readyz(tmp_path: Path, pg_url: str) -> None:
    """A judge with 3 slots (0.2 s a call) that queues the rest and says nothing of it,
    capped at 24 by its operator: the workers see the queue in the answers' latency and
    send fewer than the cap; /readyz shows the limit, the slots estimated and the calls
    waiting in the platform."""
    import json

    groups = [marker_group(seed, f"qs{seed}", rollouts=4, max_turns=8) for seed in range(90, 96)]
    ids = [g["group_id"] for g in groups]
    with running_judge(slow_marker(0.2), slots=3) as judge, redis_db() as broker:
        fleet = json.dumps([{"url": judge.url, "max_concurrency": 24}])
        workers = Workers(worker_env(pg_url, broker, fleet, **PLAIN), tmp_path)
        try:
            workers.start("visit_judge", 8)
            workers.start("visit_judge,snippet_matcher,credit_aggregator", 8)
            with api_client(pg_url, fleet, broker_url=broker, auto_migrate=False) as client:
                client.post("/v1/batches", json={"batch_id": "qs", "groups": groups})
                seen: list[dict[str, Any]] = []

                def learned() -> bool:
                    endpoint = client.get("/readyz").json()["judge"]["endpoints"][0]
                    seen.append(endpoint)
                    return bool(endpoint.get("queues"))

                wait_for(learned, timeout=240)
                got = batch_advantages(client, "qs", timeout=600)
                failed = failed_judgments(client, ids)
        finally:
            workers.stop_all()
    want, _ = reference(tmp_path, groups)
    assert_same_advantages(got, want)
    assert failed == 0
    shown = seen[-1]
    assert shown["slots_estimate"] is not None and 1.5 <= shown["slots_estimate"] <= 12, shown
    assert shown["limit"] < 24, shown
    assert isinstance(shown["waiting"], int) and shown["waiting"] >= 0


def test_a_small_server_without_keepalive(tmp_path: Path, pg_url: str) -> None:
    groups = [marker_group(seed, f"sb{seed}", rollouts=4, max_turns=8) for seed in range(80, 86)]
    ids = [g["group_id"] for g in groups]
    with running_judge(slow_marker(0.1), close_connections=True, backlog=5) as judge, redis_db() as broker:
        workers = Workers(worker_env(pg_url, broker, judge.url, **PLAIN), tmp_path)
        try:
            workers.start("visit_judge", 8)
            workers.start("visit_judge,snippet_matcher,credit_aggregator", 8)
            with api_client(pg_url, judge.url, broker_url=broker, auto_migrate=False) as client:
                got = run_batch(client, "sb", groups)
                failed = failed_judgments(client, ids)
        finally:
            workers.stop_all()
        ports = len({c.client_port for c in judge.calls})
    want, _ = reference(tmp_path, groups)
    assert_same_advantages(got, want)
    assert failed == 0
    assert ports == len(judge.calls)  # a new connection for every call


def test_a_slow_replica_receives_less(tmp_path: Path, pg_url: str) -> None:
    groups = [marker_group(seed, f"sr{seed}", rollouts=4, max_turns=8) for seed in range(90, 96)]
    with running_judge(slow_marker(0.02)) as fast, running_judge(slow_marker(0.4)) as slow, redis_db() as broker:
        fleet = f"{fast.url},{slow.url}"
        workers = Workers(worker_env(pg_url, broker, fleet, **PLAIN), tmp_path)
        try:
            workers.start("visit_judge", 8)
            workers.start("visit_judge,snippet_matcher,credit_aggregator", 8)
            with api_client(pg_url, fleet, broker_url=broker, auto_migrate=False) as client:
                got = run_batch(client, "sr", groups)
        finally:
            workers.stop_all()
        shares = (len(fast.calls), len(slow.calls))
    want, _ = reference(tmp_path, groups)
    assert_same_advantages(got, want)
    assert shares[1] < 0.3 * sum(shares), shares


def test_a_second_worker_starts_from_what_the_first_learned(tmp_path: Path, pg_url: str) -> None:
    """The first worker alone learns the judge's quota from its 429s; a second started
    afterwards reads it from Redis: the next batch, on both, is paced from its first call."""
    first = [marker_group(seed, f"l1-{seed}", rollouts=4, max_turns=8) for seed in range(100, 104)]
    second = [marker_group(seed, f"l2-{seed}", rollouts=4, max_turns=8) for seed in range(104, 108)]
    quota = RateLimit(per_s=30, burst=30, headers=False)
    with running_judge(slow_marker(0.05), rate=quota) as judge, redis_db() as broker:
        workers = Workers(worker_env(pg_url, broker, judge.url, **PLAIN), tmp_path)
        try:
            workers.start("visit_judge,snippet_matcher,credit_aggregator", 8)
            with api_client(pg_url, judge.url, broker_url=broker, auto_migrate=False) as client:
                got = run_batch(client, "learn", first)
                refused_first = judge.rate_limited
                raw = redis.Redis.from_url(broker).get(RedisStore.record_key(judge.url))
                learned = EndpointRecord.from_json(raw)
                time.sleep(1.5)  # the quota's bucket refills
                workers.start("visit_judge,snippet_matcher,credit_aggregator", 8)
                got |= run_batch(client, "reuse", second)
                refused_second = judge.rate_limited - refused_first
                processes = client.get("/readyz").json()["judge"]["endpoints"][0]["processes"]
        finally:
            workers.stop_all()
    want, _ = reference(tmp_path, first + second)
    assert_same_advantages(got, want)
    assert learned.rpm_inferred and learned.rpm is not None and learned.limit.epoch >= 1
    assert refused_first > 0, "the first worker had to find the quota"
    assert refused_second <= max(3, refused_first // 3), (refused_first, refused_second)
    assert processes == 2


def test_a_worker_asks_the_judge_what_it_serves_before_any_work(tmp_path: Path, pg_url: str) -> None:
    """A worker asks the judge what it serves as it starts, not at its first call, so a
    fresh deployment's first step does not wait for it (0.3-0.6 s, BENCHMARKS round 28)."""
    facts = FactsServer(context=4096)
    server = LiveServer(facts.app(), lifespan="off")
    server.start()
    try:
        with redis_db() as broker:
            workers = Workers(worker_env(pg_url, broker, f"{server.url}/v1", **PLAIN), tmp_path)
            try:
                workers.start("visit_judge", 4)
                wait_for(lambda: "/v1/models" in facts.paths, timeout=60)
            finally:
                workers.stop_all()
    finally:
        server.stop()
    assert "/v1/chat/completions" not in facts.paths  # nothing was posted: no call was made
