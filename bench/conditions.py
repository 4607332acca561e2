"""The step against the judges users run, repeated (issue 32).

    python -m bench.run --sections judges --judges backlog,rate,rate-headers,replicas,slow --repeat 5

The platform is started as a new operator would: ``drcredit serve`` and two plain
``drcredit worker`` processes, no flags (the fleet learns each endpoint), on Postgres and
Redis, against simulated judges (:mod:`bench.judge_sim`) that answer in ``--latency``:

- ``backlog``: one server with a listen backlog of 5 that closes every connection after
  its answer (HTTP/1.0 style). Its own throughput bounds the step, so each run is compared
  with the in-trainer asyncio scorer on the same server, right after it.
- ``rate``: a hosted judge allowing ``--judge-rate`` requests a second (a token bucket of
  one second's worth), answering 429 with ``retry-after`` beyond; ``rate-headers``: the
  same, also sending OpenAI's ``x-ratelimit-*`` headers. Bound: the longer of the
  critical path and calls / rate.
- ``replicas``: two servers in ``DRCREDIT_JUDGE_BASE_URL``; one is killed (SIGKILL) when a
  third of the step's answers are in, and started again after the run.
- ``slow``: two servers, the second answering ``--slow-factor`` times slower.
- ``queueing``: a server that queues (:mod:`bench.queueing_server`: :data:`QUEUE_SLOTS`
  slots, 2 s a call, first come first served inside, nothing saying how many), with
  ``DRCREDIT_JUDGE_TIMEOUT_S=20``; ``queueing-slow``: the same with a lognormal latency of
  median 8 s (sigma 0.5) and the default timeout. Bound: the longer of the critical path
  and calls needed x mean latency / slots; also reported: calls sent per call needed and
  answers abandoned by a client that timed out.
- ``audit``: one server for training and one for an audit judge; every other run starts an
  audit of ``--audit-sample`` groups of the previous run right before posting the step,
  so the runs with an audit beside them compare with those without.

Every run reports its wall time against its bound, the 429 answers per call served, each
endpoint's share of the calls, the judgments that failed, and the largest difference of
any advantage from a reference run of the same step on one healthy judge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.baseline import score_step
from bench.paths import critical_path_calls
from bench.platform import Proc, Stack, bench_redis, free_port, fresh_database, plain_env, start_judge, start_plain
from bench.repeat import one_run, renamed, summary
from drcredit.judges.fleet.health import PROBE_MAX_S

CONDITIONS = ("backlog", "rate", "rate-headers", "replicas", "slow", "audit", "queueing", "queueing-slow")
#: The queueing conditions' server: slots, median latency, lognormal sigma, answer timeout.
QUEUE_SLOTS = 32
QUEUEING = {"queueing": (2.0, 0.0, "20"), "queueing-slow": (8.0, 0.5, None)}


def condition_latency(condition: str, args: argparse.Namespace) -> float:
    """The mean latency of a condition's judge (a lognormal's is its median x e^(sigma^2/2))."""
    if condition in QUEUEING:
        median, sigma, _ = QUEUEING[condition]
        return median * math.exp(sigma**2 / 2)
    return float(args.latency)


def judge_flags(condition: str, args: argparse.Namespace) -> list[list[str]]:
    """``bench.judge_sim`` flags of each endpoint a condition runs."""
    if condition == "backlog":
        return [["--backlog", "5", "--no-keepalive"]]
    if condition == "rate":
        return [["--rate", str(args.judge_rate)]]
    if condition == "rate-headers":
        return [["--rate", str(args.judge_rate), "--rate-headers"]]
    if condition == "replicas":
        return [[], []]
    if condition == "slow":
        return [[], ["--latency", str(args.latency * args.slow_factor)]]
    if condition == "audit":
        return [[], []]
    if condition in QUEUEING:
        median, sigma, _ = QUEUEING[condition]
        return [["--slots", str(QUEUE_SLOTS), "--latency", str(median), "--lognormal-sigma", str(sigma)]]
    raise ValueError(f"unknown judge condition {condition!r} (known: {', '.join(CONDITIONS)})")


def stats(judges: list[str]) -> list[dict[str, Any]]:
    out = []
    for url in judges:
        try:
            out.append(httpx.get(f"{url}/stats", timeout=5).json())
        except httpx.HTTPError:
            out.append({"requests": 0, "rate_limited": 0, "down": True})
    return out


def reset(judges: list[str]) -> None:
    for url in judges:
        try:
            httpx.post(f"{url}/reset", timeout=5)
        except httpx.HTTPError:
            pass


def max_diff(got: dict[str, Any], want: dict[str, Any], suffix: str) -> float:
    """Largest |difference| of any advantage between a run and the reference run."""
    worst = 0.0
    for gid, doc in want.items():
        if "rollouts" not in got[f"{gid}-{suffix}"]:
            return math.inf  # no advantages at all (groups_without_advantages says why)
        for ra, rb in zip(got[f"{gid}-{suffix}"]["rollouts"], doc["rollouts"], strict=True):
            worst = max(worst, abs(ra["outcome_advantage"] - rb["outcome_advantage"]))
            for ta, tb in zip(ra["turns"], rb["turns"], strict=True):
                worst = max(worst, abs(ta["advantage"] - tb["advantage"]))
    return worst


def failed_judgments(run: dict[str, Any]) -> int:
    return sum(doc.get("progress", {}).get("judgments_failed", 0) for doc in run["advantages"].values())


def groups_without_advantages(run: dict[str, Any]) -> dict[str, Any]:
    """Groups of the step that came back without advantages (a failed group), by status."""
    return {gid: doc.get("status") for gid, doc in run["advantages"].items() if "progress" not in doc}


class Killer(threading.Thread):
    """Kills one judge process once ``fraction`` of a step's expected answers are in,
    recording how many each judge had served at that moment."""

    def __init__(self, victim: Proc, judges: list[str], expected: int, fraction: float = 1 / 3):
        super().__init__(daemon=True)
        self.victim, self.judges, self.threshold = victim, judges, expected * fraction
        self.served_before: list[int] | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.02):
            served = [s["requests"] - s.get("errors", 0) for s in stats(self.judges)]
            if sum(served) >= self.threshold:
                self.served_before = served
                self.victim.popen.kill()
                self.victim.popen.wait(10)
                return


def section_judges(args: argparse.Namespace, groups: list[dict[str, Any]], results: dict[str, Any]) -> None:
    out: dict[str, Any] = {}
    for condition in [c.strip() for c in args.judges.split(",") if c.strip()]:
        out[condition] = run_condition(condition, args, groups)
        print(condition_table(condition, out[condition]), flush=True)
    results["judges"] = out


def run_condition(condition: str, args: argparse.Namespace, groups: list[dict[str, Any]]) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp))
        try:
            # The reference: the same step on one healthy judge (its calls and advantages).
            reference_judge = start_judge(stack, args.latency, args.sigma)
            redis.Redis.from_url(bench_redis()).flushdb()
            with fresh_database() as db:
                api, procs = start_plain(stack, plain_env(reference_judge, db, bench_redis()), args.plain_workers)
                ref = one_run(api, renamed(groups, "ref"), db)
                expected_calls = stats([reference_judge])[0]["requests"]
                reference = {g["group_id"]: ref["advantages"][f"{g['group_id']}-ref"] for g in groups}
                for proc in procs:
                    proc.stop()
            flags = judge_flags(condition, args)
            ports = [free_port() for _ in flags]
            judges: list[str] = []
            judge_procs: list[Proc] = []
            for extra, port in zip(flags, ports, strict=True):
                judges.append(start_judge(stack, args.latency, args.sigma, extra, port))
                judge_procs.append(stack.procs[-1])
            redis.Redis.from_url(bench_redis()).flushdb()
            training = judges[:1] if condition == "audit" else judges
            with fresh_database() as db:
                env = plain_env(judges[0], db, bench_redis())
                env["DRCREDIT_JUDGE_BASE_URL"] = ",".join(f"{j}/v1" for j in training)
                timeout = QUEUEING.get(condition, (0, 0, None))[2]
                if timeout is not None:
                    env["DRCREDIT_JUDGE_TIMEOUT_S"] = timeout
                if condition == "audit":
                    env["DRCREDIT_AUDIT_JUDGES"] = json.dumps(
                        {"second": {"base_url": f"{judges[1]}/v1", "model": "sim"}}
                    )
                api, procs = start_plain(stack, env, args.plain_workers)
                for k in range(args.repeat):
                    if condition == "replicas" and k and judge_procs[0].popen.poll() is not None:
                        # The killed replica comes back between steps, on its port.
                        stack.procs.remove(judge_procs[0])
                        start_judge(stack, args.latency, args.sigma, flags[0], ports[0])
                        judge_procs[0] = stack.procs[-1]
                        # Each worker's health check finds it within its longest interval.
                        time.sleep(PROBE_MAX_S + 1.0)
                    reset(judges)
                    killer = None
                    if condition == "replicas":
                        killer = Killer(judge_procs[0], judges, expected_calls)
                        killer.start()
                    step = renamed(groups, f"r{k}")
                    audit = None
                    if condition == "audit" and k % 2 == 1:
                        audit = start_audit(api, renamed(groups, f"r{k - 1}"), args.audit_sample, k)
                    run = one_run(api, step, db)
                    if killer is not None:
                        killer.stop.set()
                        killer.join()
                    served = stats(training)
                    runs.append(measure(condition, args, step, run, served, reference, f"r{k}", killer))
                    if condition in QUEUEING:
                        runs[-1].update(queue_figures(served[0], expected_calls))
                    if condition == "audit":
                        runs[-1]["audit_beside"] = audit is not None
                        if audit is not None:
                            runs[-1].update(finish_audit(api, audit))
                    if condition == "backlog":
                        runs[-1].update(baseline(judges[0], step, args))
                    print(run_line(k, args.repeat, runs[-1]), flush=True)
        finally:
            stack.stop()
    return summarize(condition, runs, expected_calls)


def measure(
    condition: str,
    args: argparse.Namespace,
    step: list[dict[str, Any]],
    run: dict[str, Any],
    served: list[dict[str, Any]],
    reference: dict[str, Any],
    suffix: str,
    killer: Killer | None,
) -> dict[str, Any]:
    calls = [int(s.get("requests", 0)) - int(s.get("rate_limited", 0)) for s in served]
    refused = sum(int(s.get("rate_limited", 0)) for s in served)
    total = sum(calls)
    critical = max(critical_path_calls(step, run["credits"]), 1) * condition_latency(condition, args)
    bound = critical
    if condition.startswith("rate"):
        bound = max(critical, total / args.judge_rate)
    if condition in QUEUEING:
        bound = max(critical, total * condition_latency(condition, args) / QUEUE_SLOTS)
    out: dict[str, Any] = {
        "wall_s": run["wall_s"],
        "critical_path_s": critical,
        "bound_s": bound,
        "ratio_to_bound": run["wall_s"] / bound,
        "calls_served": total,
        "rate_limited": refused,
        "rate_limited_per_served": refused / total if total else 0.0,
        "shares": [c / total if total else 0.0 for c in calls],
        "failed_judgments": failed_judgments(run),
        "groups_without_advantages": groups_without_advantages(run),
        "max_abs_diff_vs_reference": max_diff(run["advantages"], reference, suffix),
    }
    if killer is not None and killer.served_before is not None:
        before = killer.served_before
        out["shares_before_kill"] = [b / sum(before) for b in before]
        out["bound_plus_2s_ratio"] = run["wall_s"] / (1.3 * bound + 2.0)
    return out


def queue_figures(served: dict[str, Any], needed: int) -> dict[str, Any]:
    """A queueing server's count of calls sent per call needed and of abandoned answers."""
    sent = int(served.get("requests", 0))
    abandoned = int(served.get("abandoned", 0))
    return {
        "calls_sent_per_needed": sent / needed if needed else 0.0,
        "abandoned": abandoned,
        "abandoned_per_call": abandoned / sent if sent else 0.0,
        "peak_queued_in_server": int(served.get("peak_queued", 0)),
    }


def start_audit(api: str, previous: list[dict[str, Any]], sample: int, seed: int) -> tuple[str, float]:
    """Start an audit of ``sample`` groups of the previous step; (its id, when)."""
    body = {"judge": "second", "scope": {"group_ids": [g["group_id"] for g in previous]}, "sample_groups": sample}
    r = httpx.post(f"{api}/v1/audits", json=body | {"seed": seed}, timeout=60)
    r.raise_for_status()
    return r.json()["audit_id"], time.perf_counter()


def finish_audit(api: str, audit: tuple[str, float]) -> dict[str, Any]:
    """Wait for the audit started beside a step; how long it took and what it called."""
    audit_id, started = audit
    with httpx.Client(timeout=600) as client:
        while True:
            r = client.get(f"{api}/v1/audits/{audit_id}", params={"wait": 60})
            if r.status_code == 200 or "failed" in r.json().get("message", ""):
                break
    doc = r.json()
    return {
        "audit_s": time.perf_counter() - started,
        "audit_status": doc.get("status", "failed"),
        "audit_calls": (doc.get("usage") or {}).get("calls"),
    }


def baseline(judge: str, step: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The in-trainer asyncio scorer on the same server, right after the platform's run."""
    reset([judge])
    started = time.perf_counter()
    try:
        asyncio.run(score_step(f"{judge}/v1", "sim", step, args.baseline_concurrency))
    except Exception as exc:  # noqa: BLE001 - the comparator failing is recorded, not fatal
        return {"baseline_error": f"{type(exc).__name__}: {exc}"}
    seconds = time.perf_counter() - started
    return {"baseline_s": seconds}


def run_line(k: int, repeat: int, run: dict[str, Any]) -> str:
    shares = "/".join(f"{100 * s:.0f}%" for s in run["shares"])
    line = (
        f"run {k + 1}/{repeat}: {run['wall_s']:.2f} s = {run['ratio_to_bound']:.2f}x bound ({run['bound_s']:.1f} s);"
        f" 429s {run['rate_limited']} ({100 * run['rate_limited_per_served']:.1f}% of {run['calls_served']} served);"
        f" shares {shares}; failed {run['failed_judgments']}; max |diff| {run['max_abs_diff_vs_reference']:.1e}"
    )
    if run.get("groups_without_advantages"):
        line += f"; groups without advantages {run['groups_without_advantages']}"
    if "baseline_s" in run:
        line += f"; in-trainer scorer {run['baseline_s']:.2f} s ({run['wall_s'] / run['baseline_s']:.2f}x)"
    if "audit_beside" in run:
        line += "; audit beside: " + (
            f"{run['audit_calls']} calls in {run['audit_s']:.1f} s ({run['audit_status']})"
            if run["audit_beside"]
            else "none"
        )
    if "calls_sent_per_needed" in run:
        line += (
            f"; sent {run['calls_sent_per_needed']:.3f}x the calls needed; abandoned {run['abandoned']}"
            f" ({100 * run['abandoned_per_call']:.1f}%); peak queue in the server {run['peak_queued_in_server']}"
        )
    if "shares_before_kill" in run:
        line += " ; before the kill " + "/".join(f"{100 * s:.0f}%" for s in run["shares_before_kill"])
    return line


def summarize(condition: str, runs: list[dict[str, Any]], expected_calls: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "runs": runs,
        "reference_calls": expected_calls,
        "wall_s": summary([r["wall_s"] for r in runs]),
        "ratio_to_bound": summary([r["ratio_to_bound"] for r in runs]),
        "rate_limited_per_served": summary([r["rate_limited_per_served"] for r in runs]),
        "failed_judgments": sum(r["failed_judgments"] for r in runs),
        "max_abs_diff_vs_reference": max(r["max_abs_diff_vs_reference"] for r in runs),
    }
    beside = [r["ratio_to_bound"] for r in runs if r.get("audit_beside")]
    alone = [r["ratio_to_bound"] for r in runs if r.get("audit_beside") is False]
    if beside and alone:
        out["ratio_to_bound_with_audit"] = summary(beside)
        out["ratio_to_bound_without_audit"] = summary(alone)
    if any("calls_sent_per_needed" in r for r in runs):
        out["calls_sent_per_needed"] = summary([r["calls_sent_per_needed"] for r in runs])
        out["abandoned_per_call"] = summary([r["abandoned_per_call"] for r in runs])
    versus = [r["wall_s"] / r["baseline_s"] for r in runs if "baseline_s" in r]
    if versus:
        out["ratio_to_baseline"] = summary(versus)
        out["faster_than_baseline"] = sum(v < 1 for v in versus)
    return out


def condition_table(condition: str, rep: dict[str, Any]) -> str:
    def line(name: str, s: dict[str, float], unit: str = "x") -> str:
        return f"  {name:<28} median {s['median']:.2f}{unit}, p90 {s['p90']:.2f}{unit}, max {s['max']:.2f}{unit}"

    lines = [
        f"judge condition {condition} ({len(rep['runs'])} runs)",
        line("wall / bound", rep["ratio_to_bound"]),
        line("429s / calls served", rep["rate_limited_per_served"], ""),
        f"  failed judgments {rep['failed_judgments']}; max |diff| from the reference {rep['max_abs_diff_vs_reference']:.1e}",
    ]
    if "calls_sent_per_needed" in rep:
        lines.append(line("calls sent / needed", rep["calls_sent_per_needed"]))
        lines.append(line("abandoned / calls sent", rep["abandoned_per_call"], ""))
    if "ratio_to_bound_with_audit" in rep:
        lines.append(line("wall / bound, audit beside", rep["ratio_to_bound_with_audit"]))
        lines.append(line("wall / bound, no audit", rep["ratio_to_bound_without_audit"]))
    if "ratio_to_baseline" in rep:
        lines.append(line("wall / in-trainer scorer", rep["ratio_to_baseline"]))
        lines.append(f"  faster than the scorer in {rep['faster_than_baseline']} of {len(rep['runs'])} runs")
    return "\n".join(lines)
