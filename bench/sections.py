"""The benchmark's sections other than repeat, longpoll and the judge conditions (see BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.baseline import as_documents, score_step
from bench.paths import calls_saved, critical_path_calls, naive_calls, rollout_critical_path
from bench.platform import (
    Stack,
    bench_redis,
    fresh_database,
    platform_env,
    start_api,
    start_judge,
    start_worker,
)

# ----------------------------------------------------------------------------- processes
from bench.step import chain_timing, fetch_latencies, max_diff, run_step, start_platform
from bench.workload import make_group, make_step, with_judged_outcomes
from drcredit.domain.group import GroupIn


def section_step(args: argparse.Namespace, groups: list[dict[str, Any]], results: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp))
        try:
            judge = start_judge(stack, args.latency, args.sigma)
            judge_proc = stack.procs[0]
            label = f"latency {args.latency}s" + (f" lognormal sigma {args.sigma}" if args.sigma else "")
            # Distributed: API + workers on Postgres and Redis.
            redis.Redis.from_url(bench_redis()).flushdb()
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
            redis.Redis.from_url(bench_redis()).flushdb()
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
                redis.Redis.from_url(bench_redis()).flushdb()
                with fresh_database() as db:
                    env = platform_env(judge, db, bench_redis(), args.dispatch_concurrency)
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
            redis.Redis.from_url(bench_redis()).flushdb()
            with fresh_database() as db:
                env = platform_env(judge, db, bench_redis(), args.concurrency)
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
