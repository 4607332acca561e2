"""One step through the platform: start it, post the step, wait, and read where the time went."""

from __future__ import annotations

import argparse
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg

from bench.paths import percentile
from bench.platform import (
    Proc,
    Stack,
    bench_redis,
    cpu_seconds,
    peak_rss_mb,
    platform_env,
    postgres_cpu,
    start_api,
    start_worker,
)
from bench.workload import make_group

# ----------------------------------------------------------------------------- what the step's records say


def chain_timing(database_url: str, started_at: float, latency: float) -> dict[str, float]:
    """Where the step's time goes, from the stored judgments' timestamps.

    ``first_group_stored_s``: from the step's POST to the first group stored (ingest
    before any judging). For the visit chains as long as the longest: ``extra_latency_ms``,
    each call's latency as the worker saw it minus the judge's (time at the simulator
    and on the wire, and answers waiting for a busy event loop); ``turnaround_ms``, from
    an answer to the next call of the chain, beyond that call's latency.
    """
    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        first = conn.execute("SELECT extract(epoch FROM min(created_at)) FROM groups WHERE group_id NOT LIKE 'warmup%'")
        first_stored = float(first.fetchone()[0])  # type: ignore[index]
        rows = conn.execute(
            "SELECT j.group_pk, j.rollout_id, j.rubric_id, extract(epoch FROM j.created_at), j.latency_s"
            " FROM judgments AS j JOIN groups AS g ON g.id = j.group_pk"
            " WHERE j.kind = 'visit' AND j.status = 'ok' AND NOT j.cache_hit AND g.group_id NOT LIKE 'warmup%'"
            " ORDER BY j.group_pk, j.rollout_id, j.rubric_id, j.turn_index"
        ).fetchall()
    chains: dict[tuple[int, str, str], list[tuple[float, float]]] = {}
    for group_pk, rollout_id, rubric_id, stored, call_latency in rows:
        chains.setdefault((group_pk, rollout_id, rubric_id), []).append((float(stored), float(call_latency)))
    longest = max((len(c) for c in chains.values()), default=0)
    critical = [c for c in chains.values() if len(c) >= longest - 1]
    extra = [call - latency for c in critical for _, call in c[1:]]
    turnaround = [(c[i][0] - c[i - 1][0]) - c[i][1] for c in critical for i in range(1, len(c))]
    return {
        "first_group_stored_s": first_stored - started_at,
        "longest_chains": len(critical),
        "extra_latency_ms": 1000 * statistics.mean(extra) if extra else 0.0,
        "extra_latency_p90_ms": 1000 * percentile(extra, 0.9) if extra else 0.0,
        "turnaround_ms": 1000 * statistics.mean(turnaround) if turnaround else 0.0,
    }


def max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    worst = 0.0
    for gid, doc in b.items():
        for ra, rb in zip(a[gid]["rollouts"], doc["rollouts"], strict=True):
            for ta, tb in zip(ra["turns"], rb["turns"], strict=True):
                worst = max(worst, abs(ta["advantage"] - tb["advantage"]))
    return worst


# ----------------------------------------------------------------------------- one step through the platform


@dataclass
class StepRun:
    wall_s: float
    ingest_s: float
    #: time.time() when the step's POST started (compared with the database's timestamps)
    started_at: float
    advantages: dict[str, Any]
    credits: dict[str, Any]
    judge: dict[str, Any]
    cpu_platform_s: float
    cpu_judge_s: float
    peak_rss_mb: dict[str, float]
    cpu_by_process_s: dict[str, float] = field(default_factory=dict)


@contextmanager
def sampled(procs: list[Proc], into: Path | None) -> Iterator[None]:
    """With ``--profile DIR``: py-spy samples each process during the step (collapsed stacks).

    Sampling costs CPU of its own, so a profiled run's CPU figures are not the benchmark's.
    """
    if into is None:
        yield
        return
    into.mkdir(parents=True, exist_ok=True)
    spies = [
        subprocess.Popen(
            [
                str(Path(sys.executable).parent / "py-spy"),
                "record",
                "--pid",
                str(p.pid),
                "--format",
                "raw",
                "--rate",
                "200",
                "--nonblocking",
                "--gil",
                "--output",
                str(into / f"{p.name}-{i}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i, p in enumerate(procs)
    ]
    try:
        time.sleep(0.5)
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            spy.wait(60)


def run_step(
    api: str,
    groups: list[dict[str, Any]],
    judge: str,
    measured: list[Proc],
    judge_proc: Proc,
    profile: Path | None,
    fetch_credits: bool = True,
) -> StepRun:
    warm_up(api)
    with sampled(measured, profile and profile / f"step-{uuid.uuid4().hex[:6]}"):
        return _run_step(api, groups, judge, measured, judge_proc, fetch_credits)


def warm_up(api: str) -> None:
    """Score one small group first, as a service that has been up a while would have.

    A fresh process pays once for what a long-running one has cached (connections,
    compiled SQL, the judge client's session); that first-request cost is not the
    steady state the step measures, and it sat on the step's critical path.
    """
    doc = make_group(4242, f"warmup-{uuid.uuid4().hex[:6]}", rollouts=2)
    batch_id = f"warmup-{uuid.uuid4().hex[:6]}"
    with httpx.Client(timeout=600) as client:
        client.post(f"{api}/v1/batches", json={"batch_id": batch_id, "groups": [doc]}).raise_for_status()
        while client.get(f"{api}/v1/batches/{batch_id}/advantages", params={"wait": 60}).status_code != 200:
            pass


def _run_step(
    api: str,
    groups: list[dict[str, Any]],
    judge: str,
    measured: list[Proc],
    judge_proc: Proc,
    fetch_credits: bool,
) -> StepRun:
    httpx.post(f"{judge}/reset")
    per0 = {f"{p.name}#{i}": cpu_seconds(p.pid) for i, p in enumerate(measured)}
    pg0 = postgres_cpu()
    judge_cpu0 = cpu_seconds(judge_proc.pid)
    batch_id = f"bench-{uuid.uuid4().hex[:8]}"
    with httpx.Client(timeout=600) as client:
        started_at = time.time()
        started = time.perf_counter()
        # orjson, not httpx's stdlib encoder: 0.03 s instead of 0.15 s for a 27 MB step, a
        # cost of the trainer's own (the in-trainer baseline starts from memory).
        body = orjson.dumps({"batch_id": batch_id, "groups": groups})
        r = client.post(f"{api}/v1/batches", content=body, headers={"content-type": "application/json"})
        r.raise_for_status()
        ingest = time.perf_counter() - started
        while True:
            r = client.get(f"{api}/v1/batches/{batch_id}/advantages", params={"wait": 60})
            if r.status_code == 200:
                break
        wall = time.perf_counter() - started
        per = {f"{p.name}#{i}": cpu_seconds(p.pid) - per0[f"{p.name}#{i}"] for i, p in enumerate(measured)}
        per["postgres"] = postgres_cpu() - pg0
        cpu = sum(per.values())
        judge_cpu = cpu_seconds(judge_proc.pid) - judge_cpu0
        docs = {g["group_id"]: g for g in r.json()["groups"]}
        credits = {}
        if fetch_credits:
            for gid in docs:
                credits[gid] = client.get(f"{api}/v1/groups/{gid}/credits").json()
    stats = httpx.get(f"{judge}/stats").json()
    return StepRun(
        wall,
        ingest,
        started_at,
        docs,
        credits,
        stats,
        cpu,
        judge_cpu,
        {p.name: peak_rss_mb(p.pid) for p in measured},
        per,
    )


# ----------------------------------------------------------------------------- the platform under test


def start_platform(
    stack: Stack, args: argparse.Namespace, judge: str, db: str, *, outcome: bool = False
) -> tuple[str, Proc, list[Proc]]:
    """The distributed platform: the API, the visit workers, one snippet-and-aggregation
    worker and (``outcome``) one outcome-judge worker, on Postgres and Redis."""
    env = platform_env(judge, db, bench_redis(), args.concurrency)
    api, api_proc = start_api(stack, env)
    workers = [start_worker(stack, env, "visit_judge", args.concurrency) for _ in range(args.visit_workers)]
    workers.append(start_worker(stack, env, "snippet_matcher,credit_aggregator", max(32, args.concurrency // 4)))
    if outcome:
        workers.append(start_worker(stack, env, "outcome_judge", args.concurrency))
    return api, api_proc, workers


def fetch_latencies(api: str, group_ids: list[str], n: int) -> dict[str, float]:
    samples = []
    rng = random.Random(1)
    with httpx.Client(timeout=60) as client:
        for _ in range(n):
            gid = rng.choice(group_ids)
            started = time.perf_counter()
            client.get(f"{api}/v1/groups/{gid}/advantages").raise_for_status()
            samples.append((time.perf_counter() - started) * 1000)
    return {
        "n": n,
        "p50": percentile(samples, 0.5),
        "p95": percentile(samples, 0.95),
        "p99": percentile(samples, 0.99),
        "max": max(samples),
    }
