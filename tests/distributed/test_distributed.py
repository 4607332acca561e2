"""The distributed pipeline: API + Celery worker processes on real Postgres and Redis.

Every test compares with, or checks invariants of, embedded mode on the same input and
the same scripted judge; the judge server records every request it answered.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from drcredit.domain.group import GroupIn
from drcredit.scoring.dispatch import InProcessDispatcher
from drcredit.scoring.results import documents
from drcredit.storage.migrate import upgrade
from drcredit.wiring.runtime import Runtime
from tests.support.api import api_client, settings_for
from tests.support.infra import REDIS_URL, leased_redis_db
from tests.support.judge_server import Call, JudgeServer, Reply, marker_answer, running_judge
from tests.support.live import free_port
from tests.support.services import Workers, private_postgres, private_redis
from tests.support.workload import marker_group

pytestmark = pytest.mark.infra

FAST = {
    "sweep_interval_s": 1.0,
    "sweep_stale_after_s": 3.0,
    "lease_s": 4.0,
    "broker_visibility_timeout_s": 8.0,
}


def worker_env(database_url: str, broker_url: str, judge_url: str, **extra: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRCREDIT_")}
    values = {
        "database_url": database_url,
        "broker_url": broker_url,
        "judge": "openai",
        "judge_base_url": judge_url,
        "judge_model": "judge-test",
        "judge_max_attempts": 3,
        "judge_backoff_initial_s": 0.05,
        "judge_backoff_max_s": 0.5,
        "judge_timeout_s": 20,
        "log_level": "INFO",
        **FAST,
        **extra,
    }
    env.update({f"DRCREDIT_{k.upper()}": str(v) for k, v in values.items()})
    return env


#: Settings of the tests that count judge calls against a reference: reuse within each
#: group only (across groups, under ``tenant``, an identical request of two groups is
#: asked once or twice depending on whether one group's answer is kept before the other asks).
COUNTED: dict[str, Any] = {"judge_reuse": "group"}


@contextmanager
def redis_db() -> Iterator[str]:
    """A Redis database of the shared server that no other process uses, flushed before and after."""
    with leased_redis_db(REDIS_URL) as url:
        yield url


def embedded_reference(
    tmp_path: Path, judge: JudgeServer, groups: list[dict[str, Any]], **settings: Any
) -> dict[str, Any]:
    """Advantages of the same groups scored in embedded mode."""
    rt = Runtime.build(settings_for(f"sqlite:///{tmp_path / 'embedded.sqlite3'}", judge.url, **settings))
    try:
        for doc in groups:
            rt.pipeline.submit_group("ref", GroupIn.model_validate(doc))
        assert isinstance(rt.dispatcher, InProcessDispatcher)
        deadline = time.monotonic() + 120
        while True:
            rt.dispatcher.wait_idle(timeout=1)
            with rt.db.session() as s:
                rows = [documents.find_group(s, "ref", d["group_id"], full=True) for d in groups]
                if all(r.status == "done" for r in rows):
                    return {r.group_id: documents.advantages_document(s, r) for r in rows}
            assert time.monotonic() < deadline
    finally:
        rt.close()


def assert_same_advantages(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert set(got) == set(want)
    for gid, doc in want.items():
        for ra, rb in zip(got[gid]["rollouts"], doc["rollouts"], strict=True):
            assert ra["id"] == rb["id"]
            assert abs(ra["outcome_advantage"] - rb["outcome_advantage"]) <= 1e-9
            for ta, tb in zip(ra["turns"], rb["turns"], strict=True):
                assert (
                    ta["credit"] == pytest.approx(tb["credit"], abs=1e-9)
                    if tb["credit"] is not None
                    else ta["credit"] is None
                )
                assert abs(ta["advantage"] - tb["advantage"]) <= 1e-9


def request_key(call: Call) -> str:
    return call.kind + json.dumps(call.document, sort_keys=True)


def first_of(calls: list[Call], call: Call) -> Call:
    key = request_key(call)
    return next(c for c in calls if request_key(c) == key)


def reference_counts(tmp_path: Path, groups: list[dict[str, Any]]) -> tuple[dict[str, Any], Counter[str]]:
    """The embedded advantages and calls under reuse ``group`` (see :data:`COUNTED`)."""
    with running_judge(slow_marker(0.0)) as reference_judge:
        want = embedded_reference(tmp_path, reference_judge, groups, judge_reuse="group")
        return want, Counter(request_key(c) for c in reference_judge.calls)


def batch_advantages(client: TestClient, batch_id: str, timeout: float = 120) -> dict[str, Any]:
    r = client.get(f"/v1/batches/{batch_id}/advantages", params={"wait": timeout})
    assert r.status_code == 200, r.text
    return {g["group_id"]: g for g in r.json()["groups"]}


def test_batch_through_workers_matches_embedded(tmp_path: Path, pg_url: str, marker_judge: JudgeServer) -> None:
    groups = [marker_group(seed, f"g{seed}") for seed in range(6)]
    with redis_db() as broker:
        metrics_port = free_port()
        workers = Workers(worker_env(pg_url, broker, marker_judge.url, **COUNTED), tmp_path)
        try:
            workers.env = {**workers.env, "DRCREDIT_METRICS_PORT": str(metrics_port)}
            workers.start("visit_judge", 8)
            workers.env = {k: v for k, v in workers.env.items() if k != "DRCREDIT_METRICS_PORT"}
            workers.start("snippet_matcher", 4)
            workers.start("credit_aggregator", 2)
            with api_client(pg_url, marker_judge.url, broker_url=broker, auto_migrate=False) as client:
                assert client.get("/readyz").json()["broker"] == "ok"
                r = client.post("/v1/batches", json={"batch_id": "step-1", "groups": groups})
                assert r.status_code == 202
                got = batch_advantages(client, "step-1")
                metrics = client.get("/metrics").text
                worker_metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        finally:
            workers.stop_all()
    distributed_calls = Counter(request_key(c) for c in marker_judge.calls)
    marker_judge.calls.clear()
    want = embedded_reference(tmp_path, marker_judge, groups, **COUNTED)
    assert_same_advantages(got, want)
    # The same requests, as often: once per group each (identical requests in different
    # groups are separate judgments under reuse ``group``).
    assert Counter(request_key(c) for c in marker_judge.calls) == distributed_calls
    assert "drcredit_groups_ingested_total" in metrics
    assert 'drcredit_judge_calls_total{backend="openai",kind="visit",outcome="ok"}' in worker_metrics
    assert 'drcredit_tasks_total{outcome="done",queue="visit_judge"}' in worker_metrics
    assert 'drcredit_queue_depth{queue="visit_judge"}' in worker_metrics


def slow_marker(delay: float) -> Any:
    def script(call: Call) -> Reply:
        return Reply.json(marker_answer(call), delay=delay)

    return script


def wait_for(predicate: Any, timeout: float = 60, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(interval)


def judgments_done(client: TestClient, group_ids: list[str]) -> int:
    return sum(client.get(f"/v1/groups/{g}").json()["progress"]["judgments_done"] for g in group_ids)


def test_kill_9_of_a_visit_worker_loses_nothing(tmp_path: Path, pg_url: str) -> None:
    groups = [marker_group(seed, f"k{seed}", rollouts=4, max_turns=8) for seed in range(10, 16)]
    with running_judge(slow_marker(0.15)) as judge, redis_db() as broker:
        workers = Workers(worker_env(pg_url, broker, judge.url, **COUNTED), tmp_path)
        try:
            victim = workers.start("visit_judge", 4)
            workers.start("visit_judge", 4)
            workers.start("snippet_matcher,credit_aggregator", 4)
            with api_client(pg_url, judge.url, broker_url=broker, auto_migrate=False) as client:
                client.post("/v1/batches", json={"batch_id": "kill", "groups": groups})
                wait_for(lambda: judgments_done(client, [g["group_id"] for g in groups]) >= 20)
                killed_at = time.monotonic()
                victim.send_signal(signal.SIGKILL)
                victim.wait(10)
                got = batch_advantages(client, "kill", timeout=180)
        finally:
            workers.stop_all()
        calls = list(judge.calls)
    with running_judge(slow_marker(0.0)) as reference_judge:
        want = embedded_reference(tmp_path, reference_judge, groups, **COUNTED)
        expected = Counter(request_key(c) for c in reference_judge.calls)
    assert_same_advantages(got, want)
    # Only requests in flight on the killed worker may have been sent again: at most its
    # judge concurrency (4), since a judge slot covers a call and the store of its answer.
    # Everything answered and stored was never asked twice.
    extra = Counter(request_key(c) for c in calls) - expected
    assert sum(extra.values()) <= 4, extra
    assert all(c.received_at <= killed_at + 0.5 for c in calls if request_key(c) in extra and c is first_of(calls, c))


def test_streaming_rollouts_are_judged_on_arrival(tmp_path: Path, pg_url: str, marker_judge: JudgeServer) -> None:
    doc = marker_group(42, "stream", rollouts=3)
    rollouts = doc["rollouts"]
    opening = {**doc, "rollouts": rollouts[:1], "expected_rollouts": 3}
    with redis_db() as broker:
        workers = Workers(worker_env(pg_url, broker, marker_judge.url), tmp_path)
        try:
            workers.start("visit_judge,snippet_matcher,credit_aggregator", 6)
            with api_client(pg_url, marker_judge.url, broker_url=broker, auto_migrate=False) as client:
                assert client.post("/v1/groups", json=opening).status_code == 202
                for rollout in rollouts[1:]:
                    progress = lambda: client.get("/v1/groups/stream").json()["progress"]  # noqa: E731
                    wait_for(lambda p=progress: p()["judgments_done"] == p()["judgments_total"])
                    assert client.get("/v1/groups/stream/advantages").status_code == 409
                    assert client.post("/v1/groups/stream/rollouts", json=rollout).status_code == 202
                r = client.get("/v1/groups/stream/advantages", params={"wait": 60})
                assert r.status_code == 200
                got = {"stream": r.json()}
        finally:
            workers.stop_all()
    marker_judge.calls.clear()
    assert_same_advantages(got, embedded_reference(tmp_path, marker_judge, [doc]))


def test_redis_restart_mid_batch(tmp_path: Path, pg_url: str) -> None:
    groups = [marker_group(seed, f"rr{seed}", rollouts=4, max_turns=8) for seed in range(20, 25)]
    with running_judge(slow_marker(0.1)) as judge, private_redis() as broker:
        workers = Workers(worker_env(pg_url, broker.url, judge.url), tmp_path, supervise=True)
        try:
            workers.start("visit_judge", 6)
            workers.start("snippet_matcher,credit_aggregator", 4)
            with api_client(pg_url, judge.url, broker_url=broker.url, auto_migrate=False) as client:
                client.post("/v1/batches", json={"batch_id": "rr", "groups": groups})
                wait_for(lambda: judgments_done(client, [g["group_id"] for g in groups]) >= 15)
                broker.stop()
                assert client.get("/readyz").status_code == 503
                time.sleep(1.0)
                broker.start()
                wait_for(lambda: client.get("/readyz").status_code == 200, timeout=30)
                got = batch_advantages(client, "rr", timeout=180)
        finally:
            workers.stop_all()
    with running_judge(slow_marker(0.0)) as reference_judge:
        assert_same_advantages(got, embedded_reference(tmp_path, reference_judge, groups))


def test_postgres_restart_mid_batch(tmp_path: Path) -> None:
    groups = [marker_group(seed, f"pr{seed}", rollouts=4, max_turns=8) for seed in range(30, 35)]
    with running_judge(slow_marker(0.1)) as judge, private_postgres() as pg, redis_db() as broker:
        upgrade(pg.url)
        workers = Workers(worker_env(pg.url, broker, judge.url), tmp_path, supervise=True)
        try:
            workers.start("visit_judge", 6)
            workers.start("snippet_matcher,credit_aggregator", 4)
            with api_client(pg.url, judge.url, broker_url=broker, auto_migrate=False) as client:
                client.post("/v1/batches", json={"batch_id": "pr", "groups": groups})
                wait_for(lambda: judgments_done(client, [g["group_id"] for g in groups]) >= 15)
                pg.stop("fast")
                assert client.get("/readyz").status_code == 503
                time.sleep(2.0)
                pg.start()
                pg.wait_ready()
                wait_for(lambda: client.get("/readyz").status_code == 200, timeout=30)
                got = batch_advantages(client, "pr", timeout=180)
        finally:
            workers.stop_all()
    with running_judge(slow_marker(0.0)) as reference_judge:
        assert_same_advantages(got, embedded_reference(tmp_path, reference_judge, groups))


def test_two_workers_racing_on_a_redelivered_chain(tmp_path: Path, pg_url: str) -> None:
    """Every chain message is delivered three times to two workers at once."""
    groups = [marker_group(seed, f"race{seed}", rollouts=4, max_turns=8) for seed in range(40, 43)]
    with running_judge(slow_marker(0.05)) as judge, redis_db() as broker:
        env = worker_env(pg_url, broker, judge.url, **COUNTED)
        workers = Workers(env, tmp_path)
        try:
            with api_client(pg_url, judge.url, broker_url=broker, auto_migrate=False) as client:
                rt = client.app.state.runtime  # type: ignore[attr-defined]
                original = rt.dispatcher.dispatch

                def triple(units: Any) -> None:
                    for _ in range(3):
                        original(units)

                rt.dispatcher.dispatch = triple
                rt.pipeline.dispatcher = rt.dispatcher
                client.post("/v1/batches", json={"batch_id": "race", "groups": groups})
                workers.start("visit_judge", 8)
                workers.start("visit_judge", 8)
                workers.start("snippet_matcher,credit_aggregator", 4)
                got = batch_advantages(client, "race", timeout=120)
                with rt.db.session() as s:
                    from sqlalchemy import func, select

                    from drcredit.storage import models as m

                    dupes = s.execute(
                        select(
                            m.Judgment.group_pk,
                            m.Judgment.kind,
                            m.Judgment.rollout_id,
                            m.Judgment.turn_index,
                            m.Judgment.rubric_id,
                            func.count(),
                        )
                        .group_by(
                            m.Judgment.group_pk,
                            m.Judgment.kind,
                            m.Judgment.rollout_id,
                            m.Judgment.turn_index,
                            m.Judgment.rubric_id,
                        )
                        .having(func.count() > 1)
                    ).all()
        finally:
            workers.stop_all()
        counts = Counter(request_key(c) for c in judge.calls)
    assert dupes == []
    want, expected = reference_counts(tmp_path, groups)
    assert_same_advantages(got, want)
    assert counts == expected


def test_sigterm_hands_back_running_chains(tmp_path: Path, pg_url: str) -> None:
    groups = [marker_group(seed, f"term{seed}", rollouts=3, max_turns=8) for seed in range(50, 53)]
    with running_judge(slow_marker(0.3)) as judge, redis_db() as broker:
        workers = Workers(worker_env(pg_url, broker, judge.url, sweep_stale_after_s=60, **COUNTED), tmp_path)
        try:
            first = workers.start("visit_judge", 4)
            workers.start("snippet_matcher,credit_aggregator", 4)
            with api_client(pg_url, judge.url, broker_url=broker, auto_migrate=False) as client:
                client.post("/v1/batches", json={"batch_id": "term", "groups": groups})
                wait_for(lambda: judgments_done(client, [g["group_id"] for g in groups]) >= 6)
                first.send_signal(signal.SIGTERM)
                assert first.wait(30) == 0
                workers.start("visit_judge", 4)
                got = batch_advantages(client, "term", timeout=120)
        finally:
            workers.stop_all()
        counts = Counter(request_key(c) for c in judge.calls)
    want, expected = reference_counts(tmp_path, groups)
    assert_same_advantages(got, want)
    assert counts == expected
