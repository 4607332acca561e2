"""Pay for each page once: the judge servers' prefix caches and answers reused across steps (issue 43).

    python -m bench.prefix_reuse --groups 8 --replicas 1,2 --layouts rubric-first-v0,shared-first-v1 --repeat 3

The platform runs as a new operator starts it (``drcredit serve`` and plain ``drcredit
worker`` processes on Postgres and Redis) against one or two simulated judge replicas,
each with a prefix cache as vLLM keeps one and a prefill cost per uncached token
(:mod:`bench.prefix_cache`). For each prompt layout and number of replicas, each repeat
posts a step of fresh content (its own seed: nothing in it was asked before) and reads:

- the cached share of the prompt tokens the replicas served, and the tokens each
  trajectory made them prefill;
- each replica's prefill lane: when it began and ended, how long it stood idle between,
  and how long a prefill waited for it, and its busy share in each second (``lanes``);
- the step's wall time against its bound: the longer of its critical path (the longest
  chain of dependent calls, each a judge latency and, for a visit, the prefill of its
  own part of the prompt, which no earlier call can have cached: ``bench.paths``) and
  the busiest replica's prefill of
  what it had to prefill at least once (its distinct blocks, and each call's tail past
  its last full block, which no cache holds, x the prefill cost) plus one latency (a
  call's latency and its prefill are in series).

Then (last layout only) the last step is posted again under new group ids, as a later
epoch over the same questions and pages: the share of its judgments reused from the
tenant's store, the tokens billed for them, and the largest difference of any advantage
from the first post.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from bench.conditions import max_diff, reset, stats
from bench.paths import critical_path_calls, critical_path_seconds
from bench.platform import Stack, bench_redis, fresh_database, plain_env, start_judge, start_plain
from bench.repeat import one_run, renamed
from bench.workload import make_step
from drcredit.judges.prompts import check_layout


def judge_flags(args: argparse.Namespace) -> list[str]:
    return [
        "--prefix-cache-blocks",
        str(args.cache_blocks),
        "--prefill-us-per-token",
        str(args.prefill_us_per_token),
    ]


def fleet_setting(judges: list[str], max_concurrency: int | None) -> str:
    """``DRCREDIT_JUDGE_BASE_URL`` for the replicas, each capped at ``max_concurrency``
    calls in flight when one is given (the operator's cap; else the fleet learns a limit)."""
    if max_concurrency is None:
        return ",".join(f"{j}/v1" for j in judges)
    return json.dumps([{"url": f"{j}/v1", "max_concurrency": max_concurrency} for j in judges])


def condition(args: argparse.Namespace, layout: str, replicas: int, repost: bool) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    again: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp))
        try:
            judges = [start_judge(stack, args.latency, args.sigma, judge_flags(args)) for _ in range(replicas)]
            redis.Redis.from_url(bench_redis()).flushdb()
            with fresh_database() as db:
                env = plain_env(judges[0], db, bench_redis())
                env["DRCREDIT_JUDGE_BASE_URL"] = fleet_setting(judges, args.max_concurrency)
                env["DRCREDIT_JUDGE_PROMPT_LAYOUT"] = layout
                env["DRCREDIT_JUDGE_REUSE"] = "tenant"  # the default: the repost measures the store
                api, _ = start_plain(stack, env, args.workers)
                step: list[dict[str, Any]] = []
                first: dict[str, Any] = {}
                for k in range(args.repeat):
                    reset(judges)
                    step = make_step(args.groups, args.rollouts, args.seed + k, args.page_tokens)
                    first = one_run(api, step, db)
                    runs.append(measure(args, layout, step, first, stats(judges)))
                    print(f"  {layout} x{replicas} run {k + 1}: {json.dumps(runs[-1])}", flush=True)
                if repost:
                    reset(judges)
                    posted = renamed(step, "again")
                    second = one_run(api, posted, db)
                    served = stats(judges)
                    usage = [doc["usage"] for doc in second["advantages"].values()]
                    reused = sum(u["reused"] for u in usage)
                    asked = sum(u["judgments"] for u in usage)
                    reference = {g["group_id"]: first["advantages"][g["group_id"]] for g in step}
                    again = {
                        "judgments_reused": reused,
                        "judgments_asked": asked,
                        "reused_share": reused / (reused + asked) if reused + asked else None,
                        "prompt_tokens_billed": sum(u["prompt_tokens"] for u in usage),
                        "requests_served": sum(int(s["requests"]) for s in served),
                        "max_abs_diff_vs_first_post": max_diff(second["advantages"], reference, "again"),
                        "wall_s": second["wall_s"],
                    }
                    print(f"  {layout} x{replicas} reposted: {json.dumps(again)}", flush=True)
        finally:
            stack.stop()
    return {"runs": runs, "summary": summarize(runs), "reposted": again}


def measure(
    args: argparse.Namespace,
    layout: str,
    step: list[dict[str, Any]],
    run: dict[str, Any],
    served: list[dict[str, Any]],
) -> dict[str, Any]:
    trajectories = sum(len(g["rollouts"]) for g in step)
    prompt = sum(int(s["prompt_tokens"]) for s in served)
    cached = sum(int(s.get("cached_prompt_tokens", 0)) for s in served)
    prefilled = sum(int(s.get("prefilled_tokens", 0)) for s in served)
    prefill_s = args.prefill_us_per_token / 1e6
    calls_s = max(critical_path_calls(step, run["credits"]), 1) * args.latency
    critical = max(calls_s, critical_path_seconds(step, run["credits"], args.latency, prefill_s, check_layout(layout)))

    def busiest_s(counter: str) -> float:
        """The busiest replica's prefill of ``counter``'s tokens, in seconds."""
        return float(max(int(s.get(counter, 0)) for s in served) * args.prefill_us_per_token / 1e6)

    busiest = busiest_s("required_prefilled_tokens")
    lanes = [lane_timeline(s, run["posted_at"]) for s in served]
    # Every call is its latency and its prefill in series, so the busiest replica's last
    # prefill is followed (or preceded) by at least one latency.
    bound = max(critical, busiest + args.latency)
    return {
        "wall_s": round(run["wall_s"], 2),
        "bound_s": round(bound, 2),
        "critical_path_s": round(critical, 2),
        "critical_path_latencies_s": calls_s,
        "busiest_prefill_s": round(busiest, 2),
        "distinct_block_prefill_s": round(busiest_s("distinct_prefilled_tokens"), 2),
        "ratio_to_bound": round(run["wall_s"] / bound, 3),
        "requests": sum(int(s["requests"]) for s in served),
        "shares": [round(int(s["requests"]) / max(1, sum(int(x["requests"]) for x in served)), 3) for s in served],
        "prompt_tokens_per_trajectory": round(prompt / trajectories),
        "prefilled_tokens_per_trajectory": round(prefilled / trajectories),
        "cached_share": round(cached / prompt, 4) if prompt else None,
        "lanes": lanes,
        "slowest_group": run["slowest_group"],
    }


def lane_timeline(served: dict[str, Any], posted_at: float) -> dict[str, Any] | None:
    """A replica's prefill lane over the step, in seconds after the POST: when its first
    prefill began and its last ended, the time it stood idle between them, and what a
    prefill waited for the lane on average and at most. A step that ends well after its
    lanes, or whose lanes stood idle, lost its time elsewhere (its chains, the limits)."""
    started, ended = float(served.get("lane_started_at", 0)), float(served.get("lane_ended_at", 0))
    prefills = int(served.get("lane_prefills", 0))
    if not started or not prefills:
        return None
    return {
        "first_s": round(started - posted_at, 2),
        "last_s": round(ended - posted_at, 2),
        "idle_s": round(ended - started - float(served["lane_busy_s"]), 2),
        "mean_wait_s": round(float(served["lane_wait_s"]) / prefills, 3),
        "max_wait_s": round(float(served["lane_max_wait_s"]), 2),
        "busy_per_s": busy_per_second(served.get("lane_intervals", []), posted_at),
    }


def busy_per_second(intervals: Sequence[Sequence[float]], posted_at: float) -> list[float]:
    """The share of each second after the POST that the lane spent prefilling: where in
    the step it stood idle (its start, a gap while answers came in, its end)."""
    busy: list[float] = []
    for start, end in intervals:
        a, b = start - posted_at, end - posted_at
        while a < b:
            second = max(0, int(a))
            upto = min(b, second + 1.0)
            busy.extend([0.0] * (second + 1 - len(busy)))
            busy[second] += upto - max(a, 0.0)
            a = upto
    return [round(x, 2) for x in busy]


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in (
        "cached_share",
        "prefilled_tokens_per_trajectory",
        "prompt_tokens_per_trajectory",
        "wall_s",
        "ratio_to_bound",
    ):
        values = [r[key] for r in runs if r[key] is not None]
        worst = min(values) if key == "cached_share" else max(values)
        out[key] = {"median": statistics.median(values), "worst": worst}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--page-tokens", type=int, default=1500)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--sigma", type=float, default=0.0)
    parser.add_argument("--replicas", default="1,2")
    parser.add_argument("--layouts", default="rubric-first-v0,shared-first-v1")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache-blocks", type=int, default=65536, help="blocks of 256 characters per replica")
    parser.add_argument("--prefill-us-per-token", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-concurrency", type=int, default=None, help="each replica's declared max_concurrency (default: learned)"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    results: dict[str, Any] = {"args": vars(args) | {"out": str(args.out)}, "conditions": {}}
    for layout in layouts:
        for replicas in [int(x) for x in args.replicas.split(",") if x.strip()]:
            name = f"{layout} x{replicas}"
            repost = layout == layouts[-1] and replicas == max(int(x) for x in args.replicas.split(","))
            results["conditions"][name] = condition(args, layout, replicas, repost)
            print(name, json.dumps(results["conditions"][name]["summary"]), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
