"""Run the benchmark suite and print/write the figures (see BENCHMARKS.md).

    python -m bench.run                      # default: 32 x 8 step, 1 s judge latency
    python -m bench.run --groups 8 --quick   # a smaller, faster pass

Everything runs on this machine: the simulated judge, the API and workers as separate
processes, Postgres and Redis (the local servers), and the in-trainer baseline in this
process. CPU time is read from /proc (user + system, all threads) for the platform's
processes (API, workers, Postgres backends) and, apart, for the simulated judge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
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
import redis

from bench.baseline import as_documents, score_step
from bench.conditions import CONDITIONS, section_judges
from bench.conditions import condition_table as judges_table
from bench.longpoll import section_longpoll
from bench.longpoll import table as longpoll_table
from bench.paths import calls_saved, critical_path_calls, naive_calls, percentile, rollout_critical_path
from bench.platform import (
    REDIS,
    ROOT,
    Proc,
    Stack,
    cpu_seconds,
    fresh_database,
    peak_rss_mb,
    platform_env,
    postgres_cpu,
    start_api,
    start_judge,
    start_worker,
)
from bench.repeat import section_repeat
from bench.repeat import table as repeat_table
from bench.workload import make_group, make_step, with_judged_outcomes
from drcredit.domain.group import GroupIn

# ----------------------------------------------------------------------------- processes


# ----------------------------------------------------------------------------- workload facts


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


# ----------------------------------------------------------------------------- sections


def start_platform(
    stack: Stack, args: argparse.Namespace, judge: str, db: str, *, outcome: bool = False
) -> tuple[str, Proc, list[Proc]]:
    """The distributed platform: the API, the visit workers, one snippet-and-aggregation
    worker and (``outcome``) one outcome-judge worker, on Postgres and Redis."""
    env = platform_env(judge, db, REDIS, args.concurrency)
    api, api_proc = start_api(stack, env)
    workers = [start_worker(stack, env, "visit_judge", args.concurrency) for _ in range(args.visit_workers)]
    workers.append(start_worker(stack, env, "snippet_matcher,credit_aggregator", max(32, args.concurrency // 4)))
    if outcome:
        workers.append(start_worker(stack, env, "outcome_judge", args.concurrency))
    return api, api_proc, workers


def section_step(args: argparse.Namespace, groups: list[dict[str, Any]], results: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp))
        try:
            judge = start_judge(stack, args.latency, args.sigma)
            judge_proc = stack.procs[0]
            label = f"latency {args.latency}s" + (f" lognormal sigma {args.sigma}" if args.sigma else "")
            # Distributed: API + workers on Postgres and Redis.
            redis.Redis.from_url(REDIS).flushdb()
            with fresh_database() as db:
                api, api_proc, workers = start_platform(stack, args, judge, db)
                dist = run_step(api, groups, judge, [api_proc, *workers], judge_proc, args.profile)
                timing = chain_timing(db, dist.started_at, args.latency)
                fetch = fetch_latencies(api, list(dist.advantages), args.fetches)
                stack.procs = [judge_proc]
                for proc in [api_proc, *workers]:
                    proc.stop()
            cp = critical_path_calls(groups, dist.credits)
            bound = cp * args.latency
            # Embedded: one API process, SQLite, in-process execution.
            env = platform_env(judge, f"sqlite:///{Path(tmp) / 'embedded.sqlite3'}", None, args.embedded_concurrency)
            api, api_proc = start_api(stack, env)
            emb = run_step(api, groups, judge, [api_proc], judge_proc, args.profile, fetch_credits=False)
            api_proc.stop()
            # Baseline: asyncio in this process against the same judge.
            httpx.post(f"{judge}/reset")
            started = time.perf_counter()
            base = asyncio.run(score_step(f"{judge}/v1", "sim", groups, args.baseline_concurrency))
            base_wall = time.perf_counter() - started
            base_stats = httpx.get(f"{judge}/stats").json()
            base_docs = as_documents(groups, base)
        finally:
            stack.stop()
    naive = naive_calls(groups)
    rollouts = sum(len(g["rollouts"]) for g in groups)
    results["step"] = {
        "judge": label,
        "groups": len(groups),
        "rollouts": rollouts,
        "critical_path_calls": cp,
        "critical_path_bound_s": bound,
        "distributed_wall_s": dist.wall_s,
        "distributed_ratio_to_bound": dist.wall_s / bound if bound else None,
        "embedded_wall_s": emb.wall_s,
        "embedded_ratio_to_bound": emb.wall_s / bound if bound else None,
        "baseline_wall_s": base_wall,
        "baseline_ratio_to_bound": base_wall / bound if bound else None,
        "distributed_vs_baseline": dist.wall_s / base_wall,
        "max_abs_diff_distributed_vs_embedded": max_diff(dist.advantages, emb.advantages),
        "max_abs_diff_distributed_vs_baseline": max_diff(dist.advantages, base_docs),
        "judge_calls": dist.judge["requests"],
        "judge_calls_embedded": emb.judge["requests"],
        "judge_calls_baseline": base_stats["requests"],
        "judge_calls_naive": naive,
        "judge_calls_saved_by": calls_saved(dist.credits),
        "calls_ratio_to_naive": dist.judge["requests"] / naive,
        "judge_calls_per_trajectory": dist.judge["requests"] / rollouts,
        "prompt_tokens": dist.judge["prompt_tokens"],
        "peak_judge_concurrency": dist.judge["peak_in_flight"],
        "timing": timing,
        "ingest_s": dist.ingest_s,
        "ingest_groups_per_s": len(groups) / dist.ingest_s,
        "fetch_advantages_ms": fetch,
        "peak_rss_mb": {**dist.peak_rss_mb, "embedded api": emb.peak_rss_mb.get("api", 0.0)},
        "platform_cpu_s_distributed": dist.cpu_platform_s,
        "platform_cpu_s_by_process": dist.cpu_by_process_s,
        "judge_sim_cpu_s": dist.cpu_judge_s,
    }


def section_outcome(args: argparse.Namespace, groups: list[dict[str, Any]], results: dict[str, Any]) -> None:
    """The default step with the outcome reward judged by the service (docs/method.md, "Outcome reward").

    Distributed, as the step section runs it plus one outcome-judge worker. Outcome calls
    depend on no other call, so they add one level to a rollout's chain of dependent calls
    at most: the bound is the longer of the process critical path and one call.
    """
    judged = [with_judged_outcomes(g) for g in groups]
    rollouts = sum(len(g["rollouts"]) for g in groups)
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp))
        try:
            judge = start_judge(stack, args.latency, args.sigma)
            judge_proc = stack.procs[0]
            redis.Redis.from_url(REDIS).flushdb()
            with fresh_database() as db:
                api, api_proc, workers = start_platform(stack, args, judge, db, outcome=True)
                run = run_step(api, judged, judge, [api_proc, *workers], judge_proc, args.profile)
        finally:
            stack.stop()
    cp = max(critical_path_calls(judged, run.credits), 1)
    bound = cp * args.latency
    process = run.judge["visit"] + run.judge["snippet"]
    outcome = run.judge["rubric"] + run.judge["citation"]
    results["outcome"] = {
        "groups": len(groups),
        "rollouts": rollouts,
        "critical_path_calls": cp,
        "critical_path_bound_s": bound,
        "distributed_wall_s": run.wall_s,
        "distributed_ratio_to_bound": run.wall_s / bound,
        "judge_calls": run.judge["requests"],
        "process_calls_per_trajectory": process / rollouts,
        "outcome_calls_per_trajectory": outcome / rollouts,
        "rubric_calls": run.judge["rubric"],
        "citation_calls": run.judge["citation"],
        "paper_process_tasks_per_trajectory": 29.09,
        "platform_cpu_s_distributed": run.cpu_platform_s,
        "platform_cpu_ms_per_call": run.cpu_platform_s / run.judge["requests"] * 1000,
        "platform_cpu_s_by_process": run.cpu_by_process_s,
        "judge_sim_cpu_s": run.cpu_judge_s,
        "failed_judgments": sum(d["progress"]["judgments_failed"] for d in run.advantages.values()),
    }


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


def section_dispatch(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """An instant judge: what the platform itself costs per judge call."""
    groups = make_step(args.dispatch_groups or args.groups, args.rollouts, 99, args.page_tokens, args.page_failure_rate)
    out: dict[str, Any] = {}
    for workers in (1, args.visit_workers):
        with tempfile.TemporaryDirectory() as tmp:
            stack = Stack(Path(tmp))
            try:
                judge = start_judge(stack, 0.0, 0.0)
                judge_proc = stack.procs[0]
                redis.Redis.from_url(REDIS).flushdb()
                with fresh_database() as db:
                    env = platform_env(judge, db, REDIS, args.dispatch_concurrency)
                    api, api_proc = start_api(stack, env)
                    procs = [
                        start_worker(
                            stack, env, "visit_judge,snippet_matcher,credit_aggregator", args.dispatch_concurrency
                        )
                        for _ in range(workers)
                    ]
                    run = run_step(
                        api, groups, judge, [api_proc, *procs], judge_proc, args.profile, fetch_credits=False
                    )
                    for proc in [api_proc, *procs]:
                        proc.stop()
            finally:
                stack.stop()
        calls = run.judge["requests"]
        out[f"{workers}_worker"] = {
            "workers": workers,
            "judge_calls": calls,
            "wall_s": run.wall_s,
            "calls_per_s": calls / run.wall_s,
            "calls_per_s_per_worker": calls / run.wall_s / workers,
            "platform_cpu_ms_per_call": 1000 * run.cpu_platform_s / calls,
            "judge_sim_cpu_ms_per_call": 1000 * run.cpu_judge_s / calls,
            "platform_cpu_ms_per_call_by_process": {
                name: 1000 * cpu / calls for name, cpu in run.cpu_by_process_s.items()
            },
        }
    results["dispatch"] = out


def section_calls(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Judge calls against the naive count as the share of failed pages varies.

    Under the method (docs/method.md) the calls a step needs are fixed by its content: one per (visit with a
    usable page, positive rubric), one per search with unvisited results unless its
    navigation credit is saturated, identical requests once. The share of visits
    whose every page failed is what moves the ratio most; this section shows it. It
    runs the embedded stack with an instant judge (wall time is not measured here).
    """
    rows = []
    for rate in (float(x) for x in args.calls_failure_rates.split(",") if x.strip()):
        groups = make_step(args.groups, args.rollouts, args.seed, args.page_tokens, rate)
        with tempfile.TemporaryDirectory() as tmp:
            stack = Stack(Path(tmp))
            try:
                judge = start_judge(stack, 0.0, 0.0)
                env = platform_env(judge, f"sqlite:///{Path(tmp) / 'calls.sqlite3'}", None, args.dispatch_concurrency)
                api, api_proc = start_api(stack, env)
                run = run_step(api, groups, judge, [api_proc], stack.procs[0], None)
            finally:
                stack.stop()
        naive = naive_calls(groups)
        rows.append(
            {
                "page_failure_rate": rate,
                "judge_calls": run.judge["requests"],
                "naive": naive,
                "ratio_to_naive": run.judge["requests"] / naive,
                "saved_by": calls_saved(run.credits),
            }
        )
    results["calls"] = rows


def section_streaming(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Rollouts arrive one by one; how long after the last one are the advantages there?

    A rollout arrives when the policy has generated it: after ``--turn-time`` seconds per
    turn from the step's start, so longer rollouts arrive later, as in a real step. The
    target compares the wait after the last arrival with that rollout's own critical
    path; the exact bound also counts earlier rollouts still being judged.
    """
    groups = [
        make_group(
            500 + k, f"stream-{uuid.uuid4().hex[:6]}-{k}", args.rollouts, args.page_tokens, args.page_failure_rate
        )
        for k in range(args.stream_groups)
    ]
    samples = []
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp))
        try:
            judge = start_judge(stack, args.latency, 0.0)
            redis.Redis.from_url(REDIS).flushdb()
            with fresh_database() as db:
                env = platform_env(judge, db, REDIS, args.concurrency)
                api, _ = start_api(stack, env)
                for _ in range(args.visit_workers):
                    start_worker(stack, env, "visit_judge", args.concurrency)
                start_worker(stack, env, "snippet_matcher,credit_aggregator", 32)
                with httpx.Client(timeout=600) as client:
                    for doc in groups:
                        group = GroupIn.model_validate(doc)
                        by_id = {r.id: r for r in group.rollouts}
                        arrivals = sorted((len(r["turns"]) * args.turn_time, r["id"], r) for r in doc["rollouts"])
                        opening = {**doc, "rollouts": [], "expected_rollouts": len(doc["rollouts"])}
                        client.post(f"{api}/v1/groups", json=opening).raise_for_status()
                        started = time.perf_counter()
                        arrived: dict[str, float] = {}
                        for offset, rid, rollout in arrivals:
                            time.sleep(max(0.0, started + offset - time.perf_counter()))
                            arrived[rid] = time.perf_counter() - started
                            client.post(f"{api}/v1/groups/{doc['group_id']}/rollouts", json=rollout).raise_for_status()
                        last = time.perf_counter()
                        while (
                            client.get(f"{api}/v1/groups/{doc['group_id']}/advantages", params={"wait": 60}).status_code
                            != 200
                        ):
                            pass
                        after = time.perf_counter() - last
                        credits = client.get(f"{api}/v1/groups/{doc['group_id']}/credits").json()
                        paths = {
                            r["id"]: rollout_critical_path(group, by_id[r["id"]], r["turns"])
                            for r in credits["rollouts"]
                        }
                        last_id = arrivals[-1][1]
                        own_s = max(paths[last_id], 1) * args.latency
                        last_at = arrived[last_id]
                        bound_s = max(arrived[rid] + paths[rid] * args.latency - last_at for rid in arrived)
                        samples.append(
                            {
                                "after_last_s": after,
                                "last_rollout_critical_path_s": own_s,
                                "ratio": after / own_s,
                                "streaming_bound_s": bound_s,
                                "ratio_to_streaming_bound": after / max(bound_s, own_s),
                            }
                        )
        finally:
            stack.stop()
    results["streaming"] = {
        "groups": samples,
        "worst_ratio": max(s["ratio"] for s in samples),
        "mean_ratio": statistics.mean(s["ratio"] for s in samples),
        "worst_ratio_to_streaming_bound": max(s["ratio_to_streaming_bound"] for s in samples),
    }


# ----------------------------------------------------------------------------- report


def table(results: dict[str, Any]) -> str:
    lines = [judges_table(name, rep) for name, rep in results.get("judges", {}).items()]
    if "repeat" in results:
        lines.append(repeat_table(results["repeat"]))
    if "longpoll" in results:
        lines.append(longpoll_table(results["longpoll"]))
    if "outcome" in results:
        o = results["outcome"]
        lines += [
            f"outcome judged by the service: {o['groups']} groups, {o['rollouts']} rollouts",
            f"  critical path          {o['critical_path_calls']} calls = {o['critical_path_bound_s']:.2f} s",
            f"  distributed wall       {o['distributed_wall_s']:.2f} s   ({o['distributed_ratio_to_bound']:.3f}x bound)",
            f"  calls per trajectory   process {o['process_calls_per_trajectory']:.2f} (paper: 29.09 tasks),"
            f" outcome {o['outcome_calls_per_trajectory']:.2f}",
            f"  platform CPU           {o['platform_cpu_ms_per_call']:.2f} ms per call, failed {o['failed_judgments']}",
            "    by process: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in o["platform_cpu_s_by_process"].items())
            + f"; judge simulator {o['judge_sim_cpu_s']:.1f} s",
        ]
    if "step" in results:
        s = results["step"]
        lines += [
            f"step: {s['groups']} groups, {s['rollouts']} rollouts, judge {s['judge']}",
            f"  critical path          {s['critical_path_calls']} calls = {s['critical_path_bound_s']:.2f} s",
            f"  distributed wall       {s['distributed_wall_s']:.2f} s   ({s['distributed_ratio_to_bound']:.3f}x bound)",
            f"  embedded wall          {s['embedded_wall_s']:.2f} s   ({s['embedded_ratio_to_bound']:.3f}x bound)",
            f"  in-trainer baseline    {s['baseline_wall_s']:.2f} s   ({s['baseline_ratio_to_bound']:.3f}x bound);"
            f" distributed/baseline {s['distributed_vs_baseline']:.3f}",
            f"  identical advantages   max |diff| dist-emb {s['max_abs_diff_distributed_vs_embedded']:.1e},"
            f" dist-baseline {s['max_abs_diff_distributed_vs_baseline']:.1e}",
            f"  judge calls            {s['judge_calls']} (embedded {s['judge_calls_embedded']}, baseline"
            f" {s['judge_calls_baseline']}, naive {s['judge_calls_naive']}: {s['calls_ratio_to_naive']:.3f}x naive);"
            f" {s['judge_calls_per_trajectory']:.1f} per trajectory; {s['prompt_tokens']} prompt tokens",
            "  calls saved by         "
            + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in s["judge_calls_saved_by"].items()),
            f"  peak judge concurrency {s['peak_judge_concurrency']}",
            f"  ingest                 {s['ingest_s']:.2f} s ({s['ingest_groups_per_s']:.1f} groups/s); first group"
            f" stored {s['timing']['first_group_stored_s']:.2f} s after the POST",
            f"  longest chains         {s['timing']['longest_chains']}: per call {s['timing']['extra_latency_ms']:.0f} ms"
            f" (p90 {s['timing']['extra_latency_p90_ms']:.0f} ms) over the judge's latency, turnaround"
            f" {s['timing']['turnaround_ms']:.0f} ms",
            f"  fetch advantages       p50 {s['fetch_advantages_ms']['p50']:.1f} ms, p95"
            f" {s['fetch_advantages_ms']['p95']:.1f} ms, p99 {s['fetch_advantages_ms']['p99']:.1f} ms",
            "  peak RSS (MB)          " + ", ".join(f"{k} {v:.0f}" for k, v in s["peak_rss_mb"].items()),
            f"  platform CPU           {s['platform_cpu_s_distributed']:.1f} s"
            f" ({1000 * s['platform_cpu_s_distributed'] / s['judge_calls']:.2f} ms per call: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in s["platform_cpu_s_by_process"].items())
            + f"); judge simulator {s['judge_sim_cpu_s']:.1f} s",
        ]
    if "dispatch" in results:
        for key, d in results["dispatch"].items():
            lines.append(
                f"dispatch ({key}): {d['judge_calls']} calls in {d['wall_s']:.2f} s = {d['calls_per_s']:.0f} calls/s"
                f" ({d['calls_per_s_per_worker']:.0f}/worker); platform CPU {d['platform_cpu_ms_per_call']:.2f} ms/call,"
                f" judge sim {d['judge_sim_cpu_ms_per_call']:.2f} ms/call\n    by process (ms/call): "
                + ", ".join(f"{k} {v:.2f}" for k, v in d["platform_cpu_ms_per_call_by_process"].items())
            )
    if "calls" in results:
        for row in results["calls"]:
            lines.append(
                f"calls at {100 * row['page_failure_rate']:.0f}% failed pages: {row['judge_calls']} of naive"
                f" {row['naive']} = {row['ratio_to_naive']:.3f}x; saved by "
                + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in row["saved_by"].items())
            )
    if "streaming" in results:
        st = results["streaming"]
        lines.append(
            f"streaming: after the last rollout, worst {st['worst_ratio']:.2f}x / mean {st['mean_ratio']:.2f}x"
            f" of its own critical path (worst {st['worst_ratio_to_streaming_bound']:.2f}x of the exact bound)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--sigma", type=float, default=0.0, help="lognormal sigma of the judge latency (0: fixed)")
    parser.add_argument("--page-tokens", type=int, default=2000)
    parser.add_argument("--visit-workers", type=int, default=2)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1024,
        help="judge calls in flight per visit worker (the simulated judge has no limit: the platform's own cap"
        " should not be what the step waits on; the default step starts ~1,650 chains)",
    )
    parser.add_argument("--embedded-concurrency", type=int, default=1024)
    parser.add_argument("--baseline-concurrency", type=int, default=4096)
    parser.add_argument(
        "--dispatch-groups", type=int, default=None, help="groups of the dispatch step (default: --groups)"
    )
    parser.add_argument("--page-failure-rate", type=float, default=0.1, help="share of visited pages that fail")
    parser.add_argument(
        "--calls-failure-rates",
        default="0.1,0.2,0.3",
        help="calls section: page failure rates to count judge calls at (embedded, instant judge)",
    )
    parser.add_argument("--dispatch-concurrency", type=int, default=64)
    parser.add_argument("--stream-groups", type=int, default=3)
    parser.add_argument(
        "--turn-time", type=float, default=2.0, help="streaming: seconds per research turn (generation + tool call)"
    )
    parser.add_argument("--fetches", type=int, default=300)
    parser.add_argument(
        "--sections",
        default="step,dispatch,streaming,calls",
        help="any of step, dispatch, streaming, calls, outcome, repeat, longpoll, judges",
    )
    parser.add_argument(
        "--judges",
        default=",".join(CONDITIONS),
        help="judges section: the judge conditions to run the step against (" + ", ".join(CONDITIONS) + ")",
    )
    parser.add_argument("--judge-rate", type=float, default=150.0, help="judges section: the rate limit (requests/s)")
    parser.add_argument("--slow-factor", type=float, default=3.0, help="judges section: the slow replica's latency x")
    parser.add_argument("--audit-sample", type=int, default=8, help="judges section, audit: groups an audit re-scores")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the step this many times in a row on serve + plain workers (adds the repeat section when > 1)",
    )
    parser.add_argument("--plain-workers", type=int, default=2, help="repeat: plain `drcredit worker` processes")
    parser.add_argument(
        "--repeat-outcome",
        action="store_true",
        help="repeat: the service also judges the outcome reward (outcome_source: judge); the bound counts"
        " outcome calls, and the in-trainer baseline (process credit only) is not run",
    )
    parser.add_argument(
        "--repeat-cold",
        action="store_true",
        help="repeat: start serve and the workers afresh before every run (each run a first step)",
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="repeat: leave out the in-trainer baseline (the platform alone)"
    )
    parser.add_argument("--longpoll-groups", type=int, default=200, help="longpoll: groups long-polled one each")
    parser.add_argument("--longpoll-latency", type=float, default=0.2, help="longpoll: median judge latency (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "latest.json")
    parser.add_argument(
        "--profile", type=Path, default=None, help="sample the platform's processes with py-spy into this directory"
    )
    args = parser.parse_args()

    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "machine": machine()}
    sections = set(args.sections.split(","))
    if args.repeat > 1 and "judges" not in sections:
        sections.add("repeat")
    if "step" in sections:
        groups = make_step(args.groups, args.rollouts, args.seed, args.page_tokens, args.page_failure_rate)
        section_step(args, groups, results)
    if "dispatch" in sections:
        section_dispatch(args, results)
    if "streaming" in sections:
        section_streaming(args, results)
    if "calls" in sections:
        section_calls(args, results)
    if "longpoll" in sections:
        section_longpoll(args, results)
    if "repeat" in sections:
        groups = make_step(args.groups, args.rollouts, args.seed, args.page_tokens, args.page_failure_rate)
        section_repeat(args, groups, results)
    if "outcome" in sections:
        groups = make_step(args.groups, args.rollouts, args.seed, args.page_tokens, args.page_failure_rate)
        section_outcome(args, groups, results)
    if "judges" in sections:
        groups = make_step(args.groups, args.rollouts, args.seed, args.page_tokens, args.page_failure_rate)
        section_judges(args, groups, results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(table(results))
    print(f"\nwritten to {args.out}")


def machine() -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(int(mem) / 1024 / 1024, 1),
        "python": sys.version.split()[0],
    }


if __name__ == "__main__":
    main()
