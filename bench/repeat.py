"""The default step run again and again, as a new operator runs the platform (issue 15).

    python -m bench.run --sections repeat --repeat 10

The platform is started once the way the README tells a newcomer: ``drcredit serve`` and
two ``drcredit worker`` processes with no flags, on Postgres and Redis, against the
simulated judge. Then the step is posted ``--repeat`` times in a row (fresh ids each
time, as consecutive training steps), and after each run the in-trainer asyncio
baseline scores the same step against the same judge. Every run reports its wall time
against the critical-path bound and against that run's baseline, plus where the tail
went: when each group was done (``groups.finished_at``) and how long the client waited
after the last one, and the machine's speed just before it (:func:`reference_ms`). The
summary gives the median, p90 and max of each ratio.
"""

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
import orjson
import psycopg
import redis

from bench.baseline import score_step
from bench.paths import critical_path_calls, percentile
from bench.platform import Stack, bench_redis, fresh_database, plain_env, start_judge, start_plain
from bench.workload import with_judged_outcomes


def renamed(groups: list[dict[str, Any]], suffix: str) -> list[dict[str, Any]]:
    return [{**g, "group_id": f"{g['group_id']}-{suffix}"} for g in groups]


def one_run(api: str, groups: list[dict[str, Any]], database_url: str) -> dict[str, Any]:
    """POST the step as one batch, long-poll its advantages; read the groups' finish times."""
    batch_id = f"rep-{uuid.uuid4().hex[:8]}"
    body = orjson.dumps({"batch_id": batch_id, "groups": groups})
    with httpx.Client(timeout=600) as client:
        posted_at = time.time()
        started = time.perf_counter()
        client.post(f"{api}/v1/batches", content=body, headers={"content-type": "application/json"}).raise_for_status()
        polls = 0
        while True:
            polls += 1
            r = client.get(f"{api}/v1/batches/{batch_id}/advantages", params={"wait": 60})
            if r.status_code == 200:
                break
        wall = time.perf_counter() - started
        received_at = time.time()
        advantages = {g["group_id"]: g for g in r.json()["groups"]}
        credits = {g["group_id"]: client.get(f"{api}/v1/groups/{g['group_id']}/credits").json() for g in groups}
    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        rows = conn.execute(
            "SELECT g.group_id, extract(epoch FROM g.created_at), extract(epoch FROM g.finished_at)"
            " FROM groups AS g JOIN batches AS b ON g.batch_pk = b.id WHERE b.batch_id = %s",
            (batch_id,),
        ).fetchall()
        slowest = max(rows, key=lambda r: float(r[2]))[0]
        anatomy = group_anatomy(conn, slowest, posted_at)
    done = sorted(float(f) - posted_at for _, _, f in rows)
    stored = sorted(float(c) - posted_at for _, c, _ in rows)
    return {
        "wall_s": wall,
        "posted_at": posted_at,
        "credits": credits,
        "advantages": advantages,
        "polls": polls,
        "last_group_stored_s": stored[-1],
        "groups_done_s": {"p50": percentile(done, 0.5), "p90": percentile(done, 0.9), "last": done[-1]},
        "client_after_last_done_s": (received_at - posted_at) - done[-1],
        "slowest_group": anatomy,
    }


def group_anatomy(conn: psycopg.Connection[Any], group_id: str, posted_at: float) -> dict[str, Any]:
    """Where one group's time went, from its stored timestamps (seconds after the POST).

    A judgment's call started ``latency_s`` before it was stored; within a visit chain
    the time between one answer's store and the next call's start is time the chain
    waited (for a judge slot, its message, or the store itself).
    """
    (created, finished) = conn.execute(
        "SELECT extract(epoch FROM created_at), extract(epoch FROM finished_at) FROM groups WHERE group_id = %s",
        (group_id,),
    ).fetchone() or (None, None)
    rows = conn.execute(
        "SELECT j.kind, j.rollout_id, j.rubric_id, j.turn_index, extract(epoch FROM j.created_at), j.latency_s,"
        " j.attempts FROM judgments AS j JOIN groups AS g ON g.id = j.group_pk"
        " WHERE g.group_id = %s AND j.status IN ('ok', 'failed') AND NOT j.cache_hit"
        " ORDER BY j.rollout_id, j.rubric_id, j.turn_index",
        (group_id,),
    ).fetchall()
    # visit calls: (stored, latency, its wait on this side for a judge place: the attempts' ``waited_s``)
    chains: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    snippets: list[tuple[float, float, str]] = []  # (stored, latency, rollout)
    outcomes: list[tuple[float, float]] = []  # rubric and citation calls
    for kind, rollout_id, rubric_id, _, stored, latency, attempts in rows:
        at, took = float(stored) - posted_at, float(latency)
        if kind == "visit":
            waited = sum(float(a.get("waited_s") or 0.0) for a in attempts or [])
            chains.setdefault((rollout_id, rubric_id), []).append((at, took, waited))
        elif kind == "snippet":
            snippets.append((at, took, rollout_id))
        else:
            outcomes.append((at, took))
    longest = max(chains.values(), key=lambda c: c[-1][0]) if chains else []
    waits = [longest[i][0] - longest[i][1] - longest[i - 1][0] for i in range(1, len(longest))]
    last_stored = max((e[0] for c in chains.values() for e in c), default=0.0)
    last_stored = max([last_stored, *(e[0] for e in snippets), *(e[0] for e in outcomes)])
    last_snippet = max(snippets, default=None)
    # when the visit judgments of the last snippet call's rollout were stored
    last_snippet_waits_on = [
        e[0] for (rollout_id, _), c in chains.items() if last_snippet and rollout_id == last_snippet[2] for e in c
    ]
    return {
        "group_id": group_id,
        "stored_s": float(created) - posted_at if created is not None else None,
        "first_call_s": min((e[0] - e[1] for c in chains.values() for e in c), default=None),
        "last_chain": {
            "calls": len(longest),
            "first_call_s": longest[0][0] - longest[0][1] if longest else None,
            "waits_between_calls_s": round(sum(waits), 3),
            "max_wait_s": round(max(waits, default=0.0), 3),
            # each call: when it started, its time, and of that its wait here for a judge place
            "each_call": [[round(end - took, 2), round(took, 3), round(waited, 3)] for end, took, waited in longest],
        },
        "last_snippet_call": max(((e[0] - e[1], e[0]) for e in snippets), default=None),
        # a snippet call that waits on its rollout's visits starts after the last of them is stored
        "last_snippet_rollout_visits_stored_s": max(last_snippet_waits_on, default=None),
        "last_outcome_call": max(((e[0] - e[1], e[0]) for e in outcomes), default=None),
        "last_judgment_stored_s": last_stored,
        "aggregated_s": float(finished) - posted_at if finished is not None else None,
    }


#: A fixed document for :func:`reference_ms`: prompt-sized text in a judge-like envelope.
_REFERENCE_DOC = {
    "model": "sim",
    "messages": [{"role": "user", "content": "evidence " * 2000}],
    "rubrics": [{"id": f"r{i}", "weight": i / 7, "tags": ["a", "b", "c"]} for i in range(40)],
}


def reference_ms() -> float:
    """CPU milliseconds of a fixed piece of Python work, timed just before a run.

    The step is CPU-bound on two cores, and machines of one kind ran the same code up to
    2x slower from one hour to the next (BENCHMARKS.md, eighth and tenth rounds), which
    moves every ratio to the bound; each run carries the machine's speed it ran at. The
    best of three timings, so a preempted one does not count.
    """
    timings = []
    for _ in range(3):
        started = time.process_time()
        for _ in range(900):
            decoded = orjson.loads(orjson.dumps(_REFERENCE_DOC))
            sorted(str(r["weight"]) + r["id"] for r in decoded["rubrics"])
            sum(i * i for i in range(300))
        timings.append((time.process_time() - started) * 1000)
    return min(timings)


#: Attempts at the in-trainer baseline per run: it is the comparator, not the platform, and
#: under its own 4,096 calls in flight its client has failed a request four times running
#: (``httpx2.ReadError`` while reading the answer's headers, after its three retries) in
#: some runs of a ten-run set. A failed attempt is recorded with the run and the step is
#: scored again from the start, so every ratio compares two complete scorings.
BASELINE_ATTEMPTS = 3


def timed_baseline(judge: str, step: list[dict[str, Any]], concurrency: int) -> tuple[float | None, list[str]]:
    """Seconds of the first complete baseline scoring of ``step`` (None: none completed),
    and the errors of the attempts that failed."""
    errors: list[str] = []
    for _ in range(BASELINE_ATTEMPTS):
        httpx.post(f"{judge}/reset")
        started = time.perf_counter()
        try:
            asyncio.run(score_step(f"{judge}/v1", "sim", step, concurrency))
        except Exception as exc:  # noqa: BLE001 - any failure of the comparator is recorded, not fatal
            cause = exc.__cause__ or exc
            errors.append(f"{type(exc).__name__} ({type(cause).__name__}) after {time.perf_counter() - started:.1f} s")
            continue
        return time.perf_counter() - started, errors
    return None, errors


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "p90": percentile(values, 0.9), "max": max(values)}


def section_repeat(args: argparse.Namespace, groups: list[dict[str, Any]], results: dict[str, Any]) -> None:
    """``--repeat-cold``: the API and workers are started afresh before every run, so each
    run is a new deployment's first step (no judge latency learned yet).
    ``--repeat-outcome``: the outcome reward is judged too. Outcome calls depend on no
    other call, so they add at most one level to the longest chain: the bound is the
    longer of the process critical path and one call (as the outcome section's)."""
    runs: list[dict[str, Any]] = []
    outcome = bool(getattr(args, "repeat_outcome", False))
    cold = bool(getattr(args, "repeat_cold", False))
    if outcome:
        groups = [with_judged_outcomes(g) for g in groups]
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp))
        try:
            judge = start_judge(stack, args.latency, args.sigma)
            redis.Redis.from_url(bench_redis()).flushdb()
            with fresh_database() as db:
                env = plain_env(judge, db, bench_redis())
                api, platform = start_plain(stack, env, args.plain_workers)
                for k in range(args.repeat):
                    if cold and k:
                        # A fresh deployment per run: every run is its processes' first step.
                        for proc in platform:
                            proc.stop()
                        api, platform = start_plain(stack, env, args.plain_workers)
                    step = renamed(groups, f"r{k}")
                    httpx.post(f"{judge}/reset")
                    reference = reference_ms()
                    run = one_run(api, step, db)
                    run.pop("advantages")
                    calls = httpx.get(f"{judge}/stats").json()["requests"]
                    bound = max(critical_path_calls(step, run.pop("credits")), 1) * args.latency
                    run.update(
                        bound_s=bound, judge_calls=calls, ratio_to_bound=run["wall_s"] / bound, reference_ms=reference
                    )
                    versus = ""
                    if not outcome and not getattr(args, "no_baseline", False):
                        baseline, errors = timed_baseline(judge, step, args.baseline_concurrency)
                        if baseline is not None:
                            run.update(baseline_s=baseline, ratio_to_baseline=run["wall_s"] / baseline)
                            versus = f", {run['ratio_to_baseline']:.2f}x baseline ({baseline:.2f} s)"
                        if errors:
                            run["baseline_errors"] = errors
                            versus += f" (baseline failed {len(errors)}x: {errors[-1]})"
                    runs.append(run)
                    print(
                        f"run {k + 1}/{args.repeat}: {run['wall_s']:.2f} s = {run['ratio_to_bound']:.2f}x bound"
                        f" ({bound:.0f} s){versus};"
                        f" groups done p50 {run['groups_done_s']['p50']:.2f} s, last {run['groups_done_s']['last']:.2f} s;"
                        f" client {run['client_after_last_done_s'] * 1000:.0f} ms after the last;"
                        f" machine reference {reference:.1f} ms",
                        flush=True,
                    )
        finally:
            stack.stop()
    results["repeat"] = repeat_summary(runs, args.plain_workers, outcome, cold)


def repeat_summary(runs: list[dict[str, Any]], plain_workers: int, outcome: bool, cold: bool) -> dict[str, Any]:
    """The set's distributions; the baseline's over the runs where it completed."""
    rep: dict[str, Any] = {
        "runs": runs,
        "plain_workers": plain_workers,
        "outcome_judged": outcome,
        "cold": cold,
        "ratio_to_bound": summary([r["ratio_to_bound"] for r in runs]),
        "client_after_last_done_ms": summary([1000 * r["client_after_last_done_s"] for r in runs]),
        "reference_ms": summary([r["reference_ms"] for r in runs]),
    }
    measured = [r["ratio_to_baseline"] for r in runs if "ratio_to_baseline" in r]
    failures = sum(len(r.get("baseline_errors", ())) for r in runs)
    if measured or failures:
        rep["baseline_runs"] = len(measured)
        rep["baseline_failures"] = failures
    if measured:
        rep["ratio_to_baseline"] = summary(measured)
    return rep


def table(rep: dict[str, Any]) -> str:
    def line(name: str, s: dict[str, float], unit: str = "x") -> str:
        return f"  {name:<26} median {s['median']:.2f}{unit}, p90 {s['p90']:.2f}{unit}, max {s['max']:.2f}{unit}"

    judged = (", outcome judged" if rep.get("outcome_judged") else "") + (", each run cold" if rep.get("cold") else "")
    lines = [
        f"repeated step ({len(rep['runs'])} runs, serve + {rep['plain_workers']} plain workers{judged})",
        line("wall / critical-path bound", rep["ratio_to_bound"]),
    ]
    if "ratio_to_baseline" in rep:
        lines.append(line("wall / in-trainer baseline", rep["ratio_to_baseline"]))
    if rep.get("baseline_failures"):
        lines.append(
            f"  (baseline complete in {rep['baseline_runs']} of {len(rep['runs'])} runs;"
            f" {rep['baseline_failures']} attempts failed)"
        )
    lines.append(line("client after last group", rep["client_after_last_done_ms"], " ms"))
    if "reference_ms" in rep:
        lines.append(line("machine reference (CPU)", rep["reference_ms"], " ms"))
    return "\n".join(lines)
