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
import json
import os
import sys
from pathlib import Path
from typing import Any

from bench.conditions import CONDITIONS, section_judges
from bench.conditions import condition_table as judges_table
from bench.longpoll import section_longpoll
from bench.longpoll import table as longpoll_table
from bench.platform import (
    ROOT,
)
from bench.repeat import section_repeat
from bench.repeat import table as repeat_table
from bench.sections import section_calls, section_dispatch, section_outcome, section_step, section_streaming

# ----------------------------------------------------------------------------- processes
from bench.tenants import section_tenants
from bench.workload import make_step


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
    parser.add_argument("--page-tokens", type=int, default=1500, help="tokens of a page's evidence (characters / 4)")
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
        help="any of step, dispatch, streaming, calls, outcome, repeat, longpoll, judges, tenants",
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
    parser.add_argument("--tenant-a-groups", type=int, default=128, help="tenants: groups of the big tenant's batch")
    parser.add_argument("--tenant-b-groups", type=int, default=16, help="tenants: groups of the small tenant's step")
    parser.add_argument("--judge-slots", type=int, default=64, help="tenants: the judge's slots (it queues the rest)")
    parser.add_argument(
        "--tenant-weight-groups", type=int, default=None, help="tenants: groups of each 3:1 batch (default: A's)"
    )
    parser.add_argument(
        "--tenant-phases",
        default="contended,weights,budget",
        help="tenants: the phases each repeat runs (contended: B beside A; weights: 3:1; budget)",
    )
    parser.add_argument(
        "--tenant-a-alone",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="tenants: also time A's batch alone (informative; no target reads it)",
    )
    parser.add_argument("--tenant-window", type=float, default=60.0, help="tenants: budget window (s) for the test")
    parser.add_argument(
        "--tenant-b-burst",
        default=None,
        metavar="WEIGHT,SECONDS",
        help="tenants: give b a burst (its trainer's steps ahead of a's batch); b then rests SECONDS"
        " between its step alone and its step beside a, as a trainer trains between steps",
    )
    parser.add_argument(
        "--tenant-learn-slots", action="store_true", help="tenants: do not declare the judge's slots (learn them)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "latest.json")
    parser.add_argument(
        "--profile", type=Path, default=None, help="sample the platform's processes with py-spy into this directory"
    )
    args = parser.parse_args()

    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "machine": machine()}
    sections = set(args.sections.split(","))
    if args.repeat > 1 and not sections & {"judges", "tenants"}:
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
    if "tenants" in sections:
        section_tenants(args, results)
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
