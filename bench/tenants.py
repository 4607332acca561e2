"""Tenants sharing one judge fleet (issue 44): fair shares, weights, budgets.

    python -m bench.run --sections tenants --repeat 3 [--tenant-a-groups 128 --tenant-b-groups 16]

One simulated judge with ``--judge-slots`` slots that queues the requests beyond them
(``bench.judge_sim --concurrency``), ``drcredit serve`` and two plain workers on Postgres
and Redis, the judge's slots declared (``max_concurrency``; ``--tenant-learn-slots``
leaves them to the fleet's learning: a learned limit above the slots queues calls in
the server, first come first served, where no share applies), every process with the
same ``DRCREDIT_API_KEYS`` and ``DRCREDIT_TENANTS``
(a, b weight 1, b with ``--tenant-b-burst`` a burst; c weight 3, d weight 1; e and f a
budget of one token a day, e refusing,
f waiting; budget windows of ``--tenant-window`` seconds). Each repeat measures:

- ``alone``: tenant b's step alone (its wall time and the judge's peak calls in flight:
  one tenant alone gets the whole fleet), then tenant a's batch alone;
- ``contended``: a's batch, and b's step posted 2 s later: b's wall time over its time
  alone (target <= 1.5x) and a's over its bound, (all calls of both / slots + a's
  critical path) x latency (target <= 1.15x);
- ``weights``: c and d post a batch each at once; the calls served per 10 s window
  (judgments stored, by tenant) while both are backlogged: every half second the
  workers' reports in Redis give each tenant's demand (calls waiting or in flight), and
  a window counts only when, all through it, each tenant wanted at least its part of the
  judge's slots (c 3/4, d 1/4): a tenant down to its last chains' calls cannot use its
  part, and the other is rightly given it (target 75/25 +- 10);
- ``budget``: e posts a step (admitted: nothing used yet), and 2 s later another: a 429
  naming ``tokens_per_day``; every group of the first ends done. f posts a step, waits
  for it, posts another: held (``waiting_for_budget``) until its window resets, then its
  first group starts within 5 s of the reset (target).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import redis

from bench.conditions import stats
from bench.paths import critical_path_calls
from bench.platform import Stack, bench_redis, fresh_database, plain_env, start_judge, start_plain
from bench.repeat import summary
from bench.tenant_samplers import WINDOW_S, DemandSampler, InFlightSampler, judge_peak, reset_peak, served_windows
from bench.workload import make_step

KEYS = {t: f"key-{t}" for t in "abcdef"}


def tenants_setting(b_burst: tuple[float, float] | None = None) -> str:
    """The bench's tenants; ``b_burst``: b's burst weight and seconds (none: weight 1 all along)."""
    return json.dumps(
        {
            **({"b": {"burst": {"weight": b_burst[0], "seconds": b_burst[1]}}} if b_burst else {}),
            "c": {"weight": 3},
            "d": {"weight": 1},
            "e": {"budget": {"tokens_per_day": 1}},
            "f": {"budget": {"tokens_per_day": 1}, "on_budget": "wait"},
        }
    )


def headers(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}", "content-type": "application/json"}


def step_of(tenant: str, groups: int, rollouts: int, seed: int) -> list[dict[str, Any]]:
    step = make_step(groups, rollouts, seed)
    return [{**g, "group_id": f"{tenant}-{uuid.uuid4().hex[:6]}-{i}"} for i, g in enumerate(step)]


class Posted:
    """One batch posted by a tenant, waited for in a thread: its wall time and documents."""

    def __init__(self, api: str, tenant: str, groups: list[dict[str, Any]]):
        self.api, self.tenant, self.groups = api, tenant, groups
        self.batch_id = f"{tenant}-{uuid.uuid4().hex[:8]}"
        self.status = 0
        self.body: dict[str, Any] = {}
        self.wall_s = 0.0
        self.started = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def post(self) -> Posted:
        self.started = time.perf_counter()
        r = httpx.post(
            f"{self.api}/v1/batches",
            content=orjson.dumps({"batch_id": self.batch_id, "groups": self.groups}),
            headers=headers(self.tenant),
            timeout=600,
        )
        self.status, self.body = r.status_code, r.json()
        if r.status_code == 202:
            self._thread.start()
        return self

    def _run(self) -> None:
        with httpx.Client(timeout=600, headers=headers(self.tenant)) as client:
            while True:
                r = client.get(f"{self.api}/v1/batches/{self.batch_id}/advantages", params={"wait": 60})
                if r.status_code == 200:
                    break
            self.wall_s = time.perf_counter() - self.started
            self.advantages = r.json()["groups"]
            self.credits = {
                g["group_id"]: client.get(f"{self.api}/v1/groups/{g['group_id']}/credits").json() for g in self.groups
            }

    def wait(self) -> Posted:
        self._thread.join()
        return self


def one_repeat(api: str, judge: str, db: str, args: argparse.Namespace, k: int) -> dict[str, Any]:
    slots = args.judge_slots
    phases = {p.strip() for p in args.tenant_phases.split(",") if p.strip()}
    out: dict[str, Any] = {}
    if "contended" in phases:
        out.update(contended(api, judge, args, k))
    if "weights" in phases:
        # weights 3:1: c and d at once.
        since = time.time()
        sampler = DemandSampler(bench_redis()).start()
        weight_groups = args.tenant_weight_groups or args.tenant_a_groups
        c = Posted(api, "c", step_of("c", weight_groups, args.rollouts, 300 + k)).post()
        d = Posted(api, "d", step_of("d", weight_groups, args.rollouts, 400 + k)).post()
        c.wait(), d.wait()
        parts = {"c": 0.75 * slots, "d": 0.25 * slots}
        windows = served_windows(db, ("c", "d"), since, sampler.finish(), parts)
        shares = [w["share"] for w in windows if w["share"] is not None and w["backlogged"]]
        out["weights_windows"] = windows
        out["weights_backlogged_windows"] = len(shares)
        out["weights_share_min"] = min(shares) if shares else None
        out["weights_share_max"] = max(shares) if shares else None
    if "budget" in phases:
        out.update(budget(api, db, args, k))
    return out


def burst_of(args: argparse.Namespace) -> tuple[float, float] | None:
    """``--tenant-b-burst WEIGHT,SECONDS``, or None."""
    if not args.tenant_b_burst:
        return None
    weight, seconds = (float(x) for x in str(args.tenant_b_burst).split(","))
    return weight, seconds


def contended(api: str, judge: str, args: argparse.Namespace, k: int) -> dict[str, Any]:
    """B's step alone, then beside A's batch posted 2 s before it."""
    latency, slots = args.latency, args.judge_slots
    out: dict[str, Any] = {}
    # alone: b's step, then a's batch, each by itself on the fleet.
    reset_peak(judge)
    before = stats([judge])[0]["requests"]
    b_alone = Posted(api, "b", step_of("b", args.tenant_b_groups, args.rollouts, 100 + k)).post().wait()
    b_calls = stats([judge])[0]["requests"] - before
    out["b_alone_s"] = b_alone.wall_s
    out["b_alone_peak_in_flight"] = judge_peak(judge)
    if args.tenant_a_alone:
        a_alone = Posted(api, "a", step_of("a", args.tenant_a_groups, args.rollouts, 200 + k)).post().wait()
        out["a_alone_s"] = a_alone.wall_s
    burst = burst_of(args)
    out["b_burst"] = burst
    if burst is not None:
        # b's trainer trains between its two steps: its burst allowance comes back meanwhile.
        time.sleep(burst[1])
    # contended: a's batch, b's step 2 s later (new content, the same shapes).
    before = stats([judge])[0]["requests"]
    sampler = InFlightSampler(judge).start()
    a = Posted(api, "a", step_of("a", args.tenant_a_groups, args.rollouts, 200 + k)).post()
    time.sleep(2.0)
    b = Posted(api, "b", step_of("b", args.tenant_b_groups, args.rollouts, 100 + k)).post()
    a.wait(), b.wait()
    in_flight = sampler.finish(slots)
    calls = stats([judge])[0]["requests"] - before
    a_chain = critical_path_calls(a.groups, a.credits) * latency
    a_bound = calls / slots * latency + a_chain
    b_chain = critical_path_calls(b.groups, b.credits) * latency
    out.update(
        {
            "b_contended_s": b.wall_s,
            "b_ratio_to_alone": b.wall_s / b_alone.wall_s,
            # What an equal share allows B: its chain, or its calls through half the slots.
            "b_half_share_bound_s": max(b_chain, b_calls / (slots / 2) * latency),
            "b_calls": b_calls,
            "a_contended_s": a.wall_s,
            "a_bound_s": a_bound,
            "a_ratio_to_bound": a.wall_s / a_bound,
            "calls_both": calls,
            # The calls the judge held, in its slots or waiting, one sample a second.
            "contended_in_flight": in_flight,
        }
    )
    return out


def budget(api: str, db: str, args: argparse.Namespace, k: int) -> dict[str, Any]:
    """A budget reached mid-run (refuse), and a step held until the window resets (wait)."""
    out: dict[str, Any] = {}
    # budget, refuse: the first step admitted, the next (2 s in, mid-run) refused.
    e1 = Posted(api, "e", step_of("e", args.tenant_b_groups, args.rollouts, 500 + k)).post()
    time.sleep(2.0)
    e2 = Posted(api, "e", step_of("e", args.tenant_b_groups, args.rollouts, 501 + k)).post()
    e1.wait()
    out["budget_refused_status"] = e2.status
    out["budget_refused_error"] = e2.body.get("error")
    out["budget_admitted_done"] = sum(1 for g in e1.advantages if g.get("status") == "done")
    out["budget_admitted_groups"] = len(e1.groups)
    # budget, wait: the second step held until the window resets.
    Posted(api, "f", step_of("f", args.tenant_b_groups, args.rollouts, 600 + k)).post().wait()
    f2 = Posted(api, "f", step_of("f", args.tenant_b_groups, args.rollouts, 601 + k)).post()
    gid = f2.groups[0]["group_id"]
    held = httpx.get(f"{api}/v1/groups/{gid}", headers=headers("f"), timeout=60).json()
    out["held_status"] = held["status"]
    f2.wait()
    if held.get("waiting_for_budget"):
        resets = datetime.fromisoformat(held["waiting_for_budget"]["resets_at"]).timestamp()
        with psycopg.connect(db.replace("postgresql+psycopg://", "postgresql://")) as conn:
            (first,) = conn.execute(
                "SELECT min(extract(epoch FROM started_at)) FROM groups WHERE group_id = ANY(%s)",
                ([g["group_id"] for g in f2.groups],),
            ).fetchone() or (None,)
        out["held_start_after_reset_s"] = float(first) - resets if first is not None else None
    return out


def section_tenants(args: argparse.Namespace, results: dict[str, Any]) -> None:
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp))
        try:
            judge = start_judge(stack, args.latency, args.sigma, ["--concurrency", str(args.judge_slots)])
            redis.Redis.from_url(bench_redis()).flushdb()
            with fresh_database() as db:
                env = plain_env(judge, db, bench_redis())
                if not args.tenant_learn_slots:
                    # The operator declares the server's slots: calls beyond them wait in the
                    # workers, where the shares apply, not in the server's own FIFO queue.
                    env["DRCREDIT_JUDGE_BASE_URL"] = json.dumps(
                        [{"url": f"{judge}/v1", "max_concurrency": args.judge_slots}]
                    )
                env["DRCREDIT_API_KEYS"] = ",".join(f"{t}:{key}" for t, key in KEYS.items())
                env["DRCREDIT_TENANTS"] = tenants_setting(burst_of(args))
                env["DRCREDIT_BUDGET_WINDOW_S"] = str(args.tenant_window)
                api, _ = start_plain(stack, env, args.plain_workers)
                for k in range(args.repeat):
                    runs.append(one_repeat(api, judge, db, args, k))
                    print(run_line(k, args.repeat, runs[-1]), flush=True)
        finally:
            stack.stop()
    contended_runs = [r for r in runs if "b_ratio_to_alone" in r]
    rep = {
        "runs": runs,
        "b_ratio_to_alone": summary([r["b_ratio_to_alone"] for r in contended_runs]) if contended_runs else None,
        "a_ratio_to_bound": summary([r["a_ratio_to_bound"] for r in contended_runs]) if contended_runs else None,
        "weights_share_min": min(
            (r["weights_share_min"] for r in runs if r.get("weights_share_min") is not None), default=None
        ),
        "weights_share_max": max(
            (r["weights_share_max"] for r in runs if r.get("weights_share_max") is not None), default=None
        ),
    }
    results["tenants"] = rep
    print(table(rep), flush=True)


def run_line(k: int, repeat: int, r: dict[str, Any]) -> str:
    parts = [f"tenants {k + 1}/{repeat}:"]
    if "b_alone_s" in r:
        parts.append(
            f"b alone {r['b_alone_s']:.1f} s (peak {r['b_alone_peak_in_flight']} in flight),"
            f" b beside a {r['b_contended_s']:.1f} s = {r['b_ratio_to_alone']:.2f}x"
            f" (an equal share allows {r['b_half_share_bound_s']:.1f} s);"
            f" a {r['a_contended_s']:.1f} s = {r['a_ratio_to_bound']:.2f}x bound ({r['a_bound_s']:.1f} s);"
        )
        f = r["contended_in_flight"]
        parts.append(
            f"calls at the judge meanwhile: median {f['median']}, p90 {f['p90']}, max {f['max']},"
            f" {f['seconds_over_twice_the_slots']} s over twice its slots;"
        )
    if "weights_windows" in r:
        share = (
            f"{100 * r['weights_share_min']:.0f}-{100 * r['weights_share_max']:.0f}%"
            if r["weights_share_min"] is not None
            else "no window"
        )
        parts.append(
            f"weight 3 served {share} per {WINDOW_S:.0f} s window"
            f" ({r['weights_backlogged_windows']} windows with both backlogged);"
        )
    if "budget_refused_status" in r:
        parts.append(
            f"budget: next POST {r['budget_refused_status']} {(r['budget_refused_error'] or {}).get('budget')},"
            f" admitted {r['budget_admitted_done']}/{r['budget_admitted_groups']} done;"
            f" held {r['held_status']}, started {r.get('held_start_after_reset_s', float('nan')):.2f} s after the reset"
        )
    return " ".join(parts)


def table(rep: dict[str, Any]) -> str:
    def line(name: str, s: dict[str, float]) -> str:
        return f"  {name:<32} median {s['median']:.2f}x, max {s['max']:.2f}x"

    lo, hi = rep["weights_share_min"], rep["weights_share_max"]
    return "\n".join(
        [
            f"tenants ({len(rep['runs'])} runs)",
            line("b beside a / b alone", rep["b_ratio_to_alone"]) if rep["b_ratio_to_alone"] else "",
            line("a beside b / bound", rep["a_ratio_to_bound"]) if rep["a_ratio_to_bound"] else "",
            f"  weight-3 tenant's share per window: {100 * lo:.0f}-{100 * hi:.0f}%" if lo is not None else "",
        ]
    )
