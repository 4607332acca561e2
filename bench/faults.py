"""A fault campaign: training steps scored on the distributed stack while faults arrive.

    python -m bench.faults --steps 20 --seed 1 [--minutes 30] [--json out.json]

The stack is the platform as deployed, every part of its own (:mod:`bench.fault_stack`):
Postgres and Redis servers on free ports, two simulated judge replicas, the API and one
worker per service, restarted when they exit as a restart policy would. Steps (seeded
batches of :mod:`bench.workload` groups) are posted one after another through the SDK,
as a trainer posts them, while faults arrive at seeded random times, one at a time
(:mod:`bench.fault_kinds`): a worker killed with SIGKILL and restarted, a judge replica
killed and restarted, Redis killed and restarted (with its data or without), Postgres stopped (a crash or a fast
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
- each step done within 60 s of its post or of the end of its last fault, whichever is later;
- every fault injected and undone (a part that does not come back ends the campaign).

Faults arrive until ``--steps`` steps are done, ``--minutes`` have passed and every kind
was injected ``--faults-per-kind`` times (each given bound met); then the step in flight
ends and one more is posted after the last fault was undone, so that the last steps'
times are measured from the end of the last fault.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.baseline import as_documents, score_step
from bench.fault_checks import (
    CHECKS,
    STEP_BOUND_S,
    STORED,
    FinalAnnouncements,
    StepResult,
    database_violations,
    max_difference,
    query,
    step_violations,
)
from bench.fault_kinds import KINDS, Injector, Schedule
from bench.fault_stack import FaultStack
from bench.platform import Stack, start_judge
from bench.repeat import renamed
from bench.workload import make_step
from drcredit.client import DrCreditClient
from drcredit.client.errors import DrCreditError, GroupFailed

#: Past the bound, a step still not done is given up as lost after this much longer.
GIVE_UP_S = 180.0


class Campaign:
    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.args = args
        self.workdir = workdir
        self.began = time.monotonic()
        self.stack = FaultStack(workdir, replicas=2, latency=args.latency, sigma=args.sigma)
        self.steps: list[StepResult] = []
        #: Each step's groups as stored when it ended (compared again at the end).
        self.snapshots: dict[str, list[tuple[Any, ...]]] = {}
        self.violations: list[tuple[str, str]] = []
        #: Checks of finished steps under way (:meth:`verify`).
        self.verifying: list[threading.Thread] = []
        self.lock = threading.Lock()

    def clock(self) -> float:
        """Seconds since the faults began."""
        return time.monotonic() - self.began

    def conninfo(self) -> str:
        return self.stack.postgres.url.replace("postgresql+psycopg://", "postgresql://")

    def enough_faults(self, schedule: Schedule) -> bool:
        """Whether the faults may stop: ``--minutes`` passed, ``--faults-per-kind`` of each
        kind injected and ``--steps`` steps done (each given bound met)."""
        a = self.args
        if a.minutes is not None and self.clock() < 60 * a.minutes:
            return False
        if a.steps is not None and len(self.steps) < a.steps:
            return False
        return all(schedule.count(kind) >= a.faults_per_kind for kind in a.kinds)

    def finished(self, schedule: Schedule) -> bool:
        """Once the faults have stopped, a last step posted after the end of the last one
        (its time is measured from that end, as the bound says)."""
        if schedule.errors or (self.steps and self.steps[-1].lost):
            return True
        if schedule.running:
            return False
        last_end = max((f.ended for f in schedule.faults), default=0.0)
        return any(s.posted >= last_end for s in self.steps)

    def run(self) -> int:
        a = self.args
        references = Stack(self.workdir)
        print(f"fault campaign: seed {a.seed}, faults {','.join(a.kinds)}, mean gap {a.gap} s", flush=True)
        try:
            self.stack.up()
            reference_judge = start_judge(references, 0.0, 0.0)
            listener = FinalAnnouncements(self.conninfo())
            listener.start()
            injector = Injector(self.stack, random.Random(a.seed), (a.down_min, a.down_max), self.clock)
            schedule = Schedule(injector, tuple(a.kinds), a.gap, lambda: self.enough_faults(schedule))
            print(f"stack up in {self.clock():.1f} s: {self.stack.api_url}, logs in {self.workdir}", flush=True)
            self.began = time.monotonic()
            schedule.start()
            with DrCreditClient(self.stack.api_url, timeout=30, max_attempts=12, backoff_max=5) as client:
                try:
                    while not self.finished(schedule):
                        self.steps.append(self.one_step(client, schedule, len(self.steps), reference_judge))
                finally:
                    schedule.stop()
            for verify in self.verifying:
                verify.join()
            time.sleep(1.0)  # the last notifications
            self.violations += database_violations(self.conninfo(), self.snapshots, listener.counts)
            listener.stopping.set()
            self.violations += [("faults", error) for error in schedule.errors]
            self.report(schedule)
        finally:
            self.stack.down()
            references.stop()
        return 1 if self.violations else 0

    def one_step(self, client: DrCreditClient, schedule: Schedule, k: int, reference_judge: str) -> StepResult:
        """Post step ``k`` as a trainer does and wait for it; compare with the reference."""
        a = self.args
        groups = renamed(make_step(a.groups, a.rollouts, seed=a.seed * 1000 + k, page_tokens=a.page_tokens), f"f{k}")
        step = StepResult(k, f"faults-{a.seed}-{k}", self.clock(), groups=len(groups))
        doc: dict[str, Any] | None = None
        posted = False
        while doc is None and not step.lost:
            try:
                if not posted:
                    client.submit_batch(groups, batch_id=step.batch_id)  # idempotent on the batch id
                    posted = True
                doc = client.wait_for_batch(step.batch_id, timeout=10, poll_wait=10)
            except GroupFailed as exc:
                doc = exc.document or {"groups": []}
                step.failed_groups = exc.group_ids
            except DrCreditError:  # not done yet, or the API out of reach for a while
                last = schedule.last_end_before(self.clock()) or step.posted
                step.lost = self.clock() - max(step.posted, last) > STEP_BOUND_S + GIVE_UP_S
        step.done = self.clock()
        step.last_fault_end = schedule.last_end_before(step.done)
        current = schedule.current
        step.faults_during = [
            f"{f.kind}@{f.started:.0f}s"
            for f in [*schedule.faults, *([current] if current is not None else [])]
            if (f.ended > step.posted or f is current) and f.started < step.done
        ]
        if doc is None:
            self.record(step)
        else:
            # Checked beside the next step: the reference and the snapshot take a while on
            # a busy machine, and faults meanwhile should meet a step in flight.
            verify = threading.Thread(target=self.verify, args=(step, groups, doc, reference_judge), daemon=True)
            verify.start()
            self.verifying.append(verify)
        return step

    def verify(self, step: StepResult, groups: list[dict[str, Any]], doc: dict[str, Any], reference_judge: str) -> None:
        """Compare a finished step with the reference scorer and keep its stored rows."""
        got = {g["group_id"]: g for g in doc["groups"]}
        step.failed_judgments = sum(int(g.get("progress", {}).get("judgments_failed", 0)) for g in doc["groups"])
        try:
            want = as_documents(groups, asyncio.run(score_step(f"{reference_judge}/v1", "sim", groups, 64)))
            step.max_diff = max_difference(got, want)
            stored = query(self.conninfo(), STORED, (step.batch_id,))
        except Exception as exc:  # noqa: BLE001 - a step that cannot be checked is a failed check
            step.max_diff = float("inf")
            with self.lock:
                self.violations.append(("exact", f"step {step.index}: not checked: {type(exc).__name__}: {exc}"))
        else:
            with self.lock:
                self.snapshots[step.batch_id] = stored
        self.record(step)

    def record(self, step: StepResult) -> None:
        since = ""
        if step.last_fault_end == float("inf"):
            since = ", during a fault"
        elif step.last_fault_end is not None:
            since = f", {step.since_last_fault_s:5.1f} s after its post or last fault"
        with self.lock:
            self.violations += step_violations(step)
            print(
                f"step {step.index:3d}: {step.wall_s:6.1f} s{since}; faults during {step.faults_during or 'none'};"
                f" max |diff| {step.max_diff:.1e}; failed judgments {step.failed_judgments}",
                flush=True,
            )

    def report(self, schedule: Schedule) -> None:
        a = self.args
        walls = [s.wall_s for s in self.steps if not s.lost]
        counts = {kind: schedule.count(kind) for kind in a.kinds}
        answers = self.stack.judge_counts()
        restarts = self.stack.self_restarts()
        print("\n== fault campaign summary ==")
        print(f"seed {a.seed}; {self.clock() / 60:.1f} min of faults; {len(self.steps)} steps")
        print(f"step: {a.groups} groups x {a.rollouts} rollouts, judge latency {a.latency} s (lognormal {a.sigma})")
        print("faults: " + ", ".join(f"{kind} {n}" for kind, n in counts.items()))
        for f in schedule.faults:
            print(f"  {f.started:7.1f}-{f.ended:7.1f} s  {f.kind:<8} {f.target:<24} {f.detail}")
        if walls:
            after = max(s.since_last_fault_s for s in self.steps if not s.lost)
            print(f"step time: median {statistics.median(walls):.1f} s, worst {max(walls):.1f} s")
            print(f"step done after its post or last fault: worst {after:.1f} s (bound {STEP_BOUND_S:.0f} s)")
        print(f"judge replicas: {answers['requests']} requests, {answers['garbage']} answered with garbage")
        print(f"processes that exited on their own and were restarted: {restarts or 'none'}")
        print("checks:")
        for check, text in CHECKS.items():
            failures = [v for c, v in self.violations if c == check]
            print(f"  {'FAIL' if failures else 'ok  '} {text}")
            for failure in failures:
                print(f"       {failure}")
        if a.json:
            out = {
                "seed": a.seed,
                "minutes": self.clock() / 60,
                "faults": [asdict(f) for f in schedule.faults],
                "fault_counts": counts,
                "steps": [
                    asdict(s) | {"wall_s": s.wall_s, "since_last_fault_s": s.since_last_fault_s} for s in self.steps
                ],
                "step_wall_s": {"median": statistics.median(walls), "worst": max(walls)} if walls else None,
                "self_restarts": restarts,
                "judge_requests": answers["requests"],
                "judge_garbage_answers": answers["garbage"],
                "violations": [{"check": c, "what": v} for c, v in self.violations],
            }
            Path(a.json).write_text(json.dumps(out, indent=2, default=str))


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


def _interrupted(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # SIGTERM (a timeout, a CI runner stopping) ends the campaign as Ctrl-C does: every
    # process of its stack is stopped and its Postgres cluster removed on the way out.
    signal.signal(signal.SIGTERM, _interrupted)
    if args.workdir:
        workdir = Path(args.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        return Campaign(args, workdir).run()
    with tempfile.TemporaryDirectory(prefix="drcredit-faults-") as tmp:
        return Campaign(args, Path(tmp)).run()


if __name__ == "__main__":
    sys.exit(main())
