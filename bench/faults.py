"""A fault campaign: training steps scored on the distributed stack while faults arrive.

    python -m bench.faults --steps 20 --seed 1 [--minutes 30] [--json out.json]

The stack is the platform as deployed, every part of its own (:mod:`bench.fault_stack`):
Postgres and Redis servers on free ports, two simulated judge replicas, the API and one
worker per service, restarted when they exit as a restart policy would. Steps (seeded
batches of :mod:`bench.workload` groups) are posted one after another through the SDK,
as a trainer posts them, while faults arrive at seeded random times, one at a time
(:mod:`bench.fault_kinds`): a worker killed with SIGKILL and restarted, a judge replica
killed and restarted, Redis killed and restarted, Postgres stopped (a crash or a fast
shutdown) and restarted, a judge replica answering garbage for a while.

It checks, and exits 1 when any check fails:

- every group exact: its advantages and credits equal those of the in-process reference
  scorer (:mod:`bench.baseline`, the pure core over asyncio) on the same judge answers;
- nothing lost: every group of every step is done, no work unit is left open;
- nothing scored twice: each group announced final at most once, its stored result
  (``finished_at``, the advantages document) unchanged from when its step ended to the
  end of the campaign, its judgments unique;
- no failed judgment (the judge answers every request validly when healthy, so a failed
  judgment is one a fault caused);
- each step done within 60 s of its post or of the end of its last fault, whichever is later.

The campaign runs until ``--steps`` steps are done, ``--minutes`` have passed and every
kind was injected ``--faults-per-kind`` times (each given bound must be met).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.baseline import as_documents, score_step
from bench.fault_kinds import KINDS, Fault, Injector, Schedule
from bench.fault_stack import FaultStack
from bench.platform import Stack, start_judge
from bench.repeat import renamed
from bench.workload import make_step
from drcredit.client import DrCreditClient
from drcredit.client.errors import DrCreditError, DrCreditTimeout, GroupFailed
from drcredit.scoring.results.events import CHANNEL

#: A step must be done this long after its post or its last fault, whichever is later.
STEP_BOUND_S = 60.0
#: Past this (after the bound) a step still not done is given up as lost.
GIVE_UP_S = 180.0
#: Largest difference from the reference taken as equal (float sums in another order).
EXACT = 1e-9


@dataclass
class StepResult:
    index: int
    batch_id: str
    posted: float
    done: float = 0.0
    groups: int = 0
    #: The end of the last fault begun before the step was done (None: none yet).
    last_fault_end: float | None = None
    faults_during: list[str] = field(default_factory=list)
    max_diff: float = 0.0
    failed_judgments: int = 0
    failed_groups: list[str] = field(default_factory=list)
    lost: bool = False

    @property
    def wall_s(self) -> float:
        return self.done - self.posted

    @property
    def since_last_fault_s(self) -> float:
        """From the later of the post and the last fault's end to done."""
        start = max(self.posted, self.last_fault_end or self.posted)
        return max(0.0, self.done - start)


def max_difference(got: dict[str, Any], want: dict[str, Any]) -> float:
    """Largest |difference| of any outcome advantage, turn advantage or credit (inf when a
    group, rollout or turn is missing, or a credit is null on one side only)."""
    worst = 0.0
    for gid, doc in want.items():
        if gid not in got or len(got[gid]["rollouts"]) != len(doc["rollouts"]):
            return float("inf")
        for ra, rb in zip(got[gid]["rollouts"], doc["rollouts"], strict=True):
            if ra["id"] != rb["id"] or len(ra["turns"]) != len(rb["turns"]):
                return float("inf")
            worst = max(worst, abs(ra["outcome_advantage"] - rb["outcome_advantage"]))
            for ta, tb in zip(ra["turns"], rb["turns"], strict=True):
                worst = max(worst, abs(ta["advantage"] - tb["advantage"]))
                final = tb.get("type") == "answer" or ta.get("type") == "answer"
                if final:
                    continue
                if (ta["credit"] is None) != (tb["credit"] is None):
                    return float("inf")
                if tb["credit"] is not None:
                    worst = max(worst, abs(ta["credit"] - tb["credit"]))
    return worst


class FinalAnnouncements(threading.Thread):
    """Counts the ``drcredit_group_final`` notifications of each group (LISTEN on its own
    connection, again after each Postgres restart): two for a group is a group finished twice."""

    def __init__(self, conninfo: str):
        super().__init__(name="announcements", daemon=True)
        self.conninfo = conninfo
        self.counts: Counter[int] = Counter()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=3) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not self.stopping.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self.counts[int(note.payload)] += 1
            except psycopg.Error:
                self.stopping.wait(0.5)


def query(conninfo: str, sql: str, params: tuple[Any, ...] = (), patience_s: float = 120) -> list[tuple[Any, ...]]:
    """Rows of ``sql``, waiting out a Postgres restart."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            with psycopg.connect(conninfo, connect_timeout=3) as conn:
                return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


STORED = (
    "SELECT g.group_id, g.status, g.aggregation, g.finished_at, md5(coalesce(g.advantages_json::text, ''))"
    " FROM groups AS g JOIN batches AS b ON g.batch_pk = b.id WHERE b.batch_id = %s ORDER BY g.group_id"
)


class Campaign:
    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args = args
        self.workdir = workdir
        self.began = time.monotonic()
        self.stack = FaultStack(workdir, replicas=2, latency=args.latency, sigma=args.sigma)
        self.steps: list[StepResult] = []
        self.snapshots: dict[str, list[tuple[Any, ...]]] = {}
        self.violations: list[str] = []

    def clock(self) -> float:
        return time.monotonic() - self.began

    def finished(self, schedule: Schedule) -> bool:
        a = self.args
        if schedule.errors:
            return True
        if a.steps is not None and len(self.steps) < a.steps:
            return False
        if a.minutes is not None and self.clock() < 60 * a.minutes:
            return False
        return all(schedule.count(kind) >= a.faults_per_kind for kind in a.kinds)

    def run(self) -> int:
        a = self.args
        references = Stack(self.workdir)
        print(f"fault campaign: seed {a.seed}, faults {','.join(a.kinds)}, mean gap {a.gap} s", flush=True)
        self.stack.up()
        reference_judge = start_judge(references, 0.0, 0.0)
        conninfo = self.stack.postgres.url.replace("postgresql+psycopg://", "postgresql://")
        listener = FinalAnnouncements(conninfo)
        listener.start()
        rng = random.Random(a.seed)
        injector = Injector(self.stack, rng, (a.down_min, a.down_max), self.clock)
        schedule = Schedule(injector, tuple(a.kinds), a.gap)
        print(f"stack up in {self.clock():.1f} s: {self.stack.api_url}, logs in {self.workdir}", flush=True)
        self.began = time.monotonic()
        schedule.start()
        client = DrCreditClient(self.stack.api_url, timeout=30, max_attempts=12, backoff_initial=0.5, backoff_max=5)
        try:
            while not self.finished(schedule):
                step = self.one_step(client, schedule, len(self.steps), reference_judge)
                self.steps.append(step)
                if step.lost:
                    break
        finally:
            schedule.stop()
            self.final_checks(listener, conninfo)
            listener.stopping.set()
            client.close()
            self.violations[:0] = [f"fault not injected: {e}" for e in schedule.errors]
            self.report(schedule)
            self.stack.down()
            references.stop()
        return 1 if self.violations else 0

    def one_step(self, client: DrCreditClient, schedule: Schedule, k: int, reference_judge: str) -> StepResult:
        a = self.args
        groups = renamed(make_step(a.groups, a.rollouts, seed=a.seed * 1000 + k, page_tokens=a.page_tokens), f"f{k}")
        step = StepResult(k, f"faults-{a.seed}-{k}", self.clock(), groups=len(groups))
        doc: dict[str, Any] | None = None
        client.submit_batch(groups, batch_id=step.batch_id)
        while doc is None:
            try:
                doc = client.wait_for_batch(step.batch_id, timeout=10, poll_wait=10)
            except GroupFailed as exc:
                doc = exc.document or {"groups": []}
                step.failed_groups = exc.group_ids
            except (DrCreditTimeout, DrCreditError):
                last = schedule.last_end_before(self.clock())
                waited = self.clock() - max(step.posted, last or step.posted)
                if waited > STEP_BOUND_S + GIVE_UP_S:
                    step.lost = True
                    break
        step.done = self.clock()
        step.last_fault_end = schedule.last_end_before(step.done)
        step.faults_during = [
            f"{f.kind}@{f.started:.0f}s" for f in schedule.faults if f.ended > step.posted and f.started < step.done
        ]
        if doc is not None:
            got = {g["group_id"]: g for g in doc["groups"]}
            step.failed_judgments = sum(int(g.get("progress", {}).get("judgments_failed", 0)) for g in doc["groups"])
            want = as_documents(groups, asyncio.run(score_step(f"{reference_judge}/v1", "sim", groups, 64)))
            step.max_diff = max_difference(got, want)
            self.snapshots[step.batch_id] = query(self.conninfo(), STORED, (step.batch_id,))
        self.check_step(step)
        since = "" if step.last_fault_end is None else f", {step.since_last_fault_s:5.1f} s after the last fault"
        print(
            f"step {k:3d}: {step.wall_s:6.1f} s{since}; faults during {step.faults_during or 'none'};"
            f" max |diff| {step.max_diff:.1e}; failed judgments {step.failed_judgments}",
            flush=True,
        )
        return step

    def conninfo(self) -> str:
        return self.stack.postgres.url.replace("postgresql+psycopg://", "postgresql://")

    def check_step(self, step: StepResult) -> None:
        name = f"step {step.index}"
        if step.lost:
            self.violations.append(f"{name}: not done {STEP_BOUND_S + GIVE_UP_S:.0f} s after its last fault (lost)")
            return
        if step.failed_groups:
            self.violations.append(f"{name}: groups failed: {', '.join(step.failed_groups)}")
        if step.max_diff > EXACT:
            self.violations.append(f"{name}: advantages differ from the reference by {step.max_diff:.3g}")
        if step.failed_judgments:
            self.violations.append(f"{name}: {step.failed_judgments} failed judgment(s)")
        if step.last_fault_end != float("inf") and step.since_last_fault_s > STEP_BOUND_S:
            self.violations.append(
                f"{name}: done {step.since_last_fault_s:.1f} s after its post or last fault (bound {STEP_BOUND_S:.0f} s)"
            )

    def final_checks(self, listener: FinalAnnouncements, conninfo: str) -> None:
        """What must hold of the whole database once the faults stopped."""
        time.sleep(1.0)  # the last notifications
        for batch_id, before in self.snapshots.items():
            after = query(conninfo, STORED, (batch_id,))
            if after != before:
                changed = [b[0] for b, c in zip(before, after, strict=False) if b != c] or ["(groups added or lost)"]
                self.violations.append(f"{batch_id}: stored results changed after the step ended: {changed}")
            not_done = [row[0] for row in after if row[1] != "done" or row[2] != "done"]
            if not_done:
                self.violations.append(f"{batch_id}: groups not done: {not_done}")
        pks = dict(query(conninfo, "SELECT id, group_id FROM groups"))
        twice = {pks.get(pk, pk): n for pk, n in listener.counts.items() if n > 1}
        if twice:
            self.violations.append(f"groups announced final more than once: {twice}")
        duplicates = query(
            conninfo,
            "SELECT count(*) FROM (SELECT 1 FROM judgments GROUP BY group_pk, kind, rollout_id, turn_index, rubric_id"
            " HAVING count(*) > 1) AS d",
        )[0][0]
        if duplicates:
            self.violations.append(f"{duplicates} judgment key(s) stored more than once")
        failed = query(conninfo, "SELECT count(*) FROM judgments WHERE status = 'failed'")[0][0]
        if failed:
            reasons = query(conninfo, "SELECT DISTINCT failure_reason FROM judgments WHERE status = 'failed' LIMIT 5")
            self.violations.append(f"{failed} failed judgment(s) stored: {[r[0] for r in reasons]}")
        open_units = query(conninfo, "SELECT status, count(*) FROM work_units WHERE status IN ('queued', 'running', 'waiting') GROUP BY status")
        if open_units:
            self.violations.append(f"work units left open: {dict(open_units)}")
        self.announced = sum(1 for n in listener.counts.values() if n >= 1)

    def report(self, schedule: Schedule) -> None:
        walls = [s.wall_s for s in self.steps if not s.lost]
        counts = {kind: schedule.count(kind) for kind in self.args.kinds}
        print("\n== fault campaign summary ==")
        print(f"seed {self.args.seed}; {self.clock() / 60:.1f} min; {len(self.steps)} steps of {self.args.groups} groups x {self.args.rollouts} rollouts")
        print("faults: " + ", ".join(f"{kind} {n}" for kind, n in counts.items()))
        for f in schedule.faults:
            print(f"  {f.started:7.1f}-{f.ended:7.1f} s  {f.kind:<8} {f.target:<24} {f.detail}")
        if walls:
            print(
                f"step time: median {statistics.median(walls):.1f} s, worst {max(walls):.1f} s;"
                f" after the last fault: worst {max(s.since_last_fault_s for s in self.steps if not s.lost):.1f} s"
                f" (bound {STEP_BOUND_S:.0f} s)"
            )
        restarts = self.stack.self_restarts()
        print(f"processes that exited on their own and were restarted: {restarts or 'none'}")
        print("checks:")
        for line in self.violations or ["all held: every group exact and done once, no failed judgment, every step within bound"]:
            print(f"  {'FAIL' if self.violations else 'ok'}: {line}")
        if self.args.json:
            out = {
                "seed": self.args.seed,
                "minutes": self.clock() / 60,
                "faults": [asdict(f) for f in schedule.faults],
                "fault_counts": counts,
                "steps": [asdict(s) | {"wall_s": s.wall_s, "since_last_fault_s": s.since_last_fault_s} for s in self.steps],
                "step_wall_s": {"median": statistics.median(walls), "worst": max(walls)} if walls else None,
                "self_restarts": restarts,
                "violations": self.violations,
            }
            Path(self.args.json).write_text(json.dumps(out, indent=2, default=str))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None, help="at least this many steps")
    p.add_argument("--minutes", type=float, default=None, help="at least this long")
    p.add_argument("--faults-per-kind", type=int, default=0, help="at least this many faults of each kind")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kinds", default=",".join(KINDS), help=f"fault kinds (of {', '.join(KINDS)})")
    p.add_argument("--gap", type=float, default=20.0, help="mean seconds between faults (exponential)")
    p.add_argument("--down-min", type=float, default=1.0, help="shortest downtime of a fault (s)")
    p.add_argument("--down-max", type=float, default=10.0, help="longest downtime (s); garbage lasts twice as long")
    p.add_argument("--groups", type=int, default=4, help="groups per step")
    p.add_argument("--rollouts", type=int, default=4, help="rollouts per group")
    p.add_argument("--page-tokens", type=int, default=300)
    p.add_argument("--latency", type=float, default=0.3, help="the judge's median latency (s)")
    p.add_argument("--sigma", type=float, default=0.5, help="its lognormal sigma")
    p.add_argument("--json", default=None, help="write the summary here as JSON")
    p.add_argument("--workdir", default=None, help="keep the logs here (default: a temporary directory)")
    args = p.parse_args(argv)
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown:
        p.error(f"--kinds: unknown {', '.join(unknown)} (known: {', '.join(KINDS)})")
    if args.steps is None and args.minutes is None and not args.faults_per_kind:
        p.error("give --steps, --minutes or --faults-per-kind")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.workdir:
        workdir = Path(args.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        return Campaign(args, workdir).run()
    with tempfile.TemporaryDirectory(prefix="drcredit-faults-") as tmp:
        return Campaign(args, Path(tmp)).run()


if __name__ == "__main__":
    sys.exit(main())
