"""What a fault campaign (:mod:`bench.faults`) checks, and how it reads what it checks.

A step's result is compared with the in-process reference scorer's; the database of the
campaign's stack is read at each step's end and once more when the faults have stopped.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg

from drcredit.scoring.results.events import CHANNEL

#: A step must be done this long after its post or the end of its last fault, whichever is later.
STEP_BOUND_S = 60.0
#: Largest difference from the reference taken as equal (float sums in another order).
EXACT = 1e-9

#: The checks, in the order the summary gives them.
CHECKS = {
    "exact": "every group exact (advantages and credits equal to the reference scorer's)",
    "lost": "nothing lost (every group done, no work unit left open)",
    "twice": "nothing scored twice (announced final once at most, stored results unchanged, judgments unique)",
    "failed": "no failed judgment",
    "bound": f"every step done within {STEP_BOUND_S:.0f} s of its post or its last fault",
    "faults": "every fault injected and undone",
}


@dataclass
class StepResult:
    index: int
    batch_id: str
    posted: float
    done: float = 0.0
    groups: int = 0
    #: The end of the last fault begun before the step was done (None: none yet; inf: under way).
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
        """From the later of the post and the last fault's end to done (0 during a fault)."""
        start = max(self.posted, self.last_fault_end or self.posted)
        return max(0.0, self.done - start)


def step_violations(step: StepResult) -> list[tuple[str, str]]:
    """(check, what went wrong) of one step."""
    name = f"step {step.index}"
    if step.lost:
        return [("lost", f"{name}: not done long after its last fault (given up)")]
    out = []
    if step.failed_groups:
        out.append(("lost", f"{name}: groups failed: {', '.join(step.failed_groups)}"))
    if step.max_diff > EXACT:
        out.append(("exact", f"{name}: advantages differ from the reference by {step.max_diff:.3g}"))
    if step.failed_judgments:
        out.append(("failed", f"{name}: {step.failed_judgments} failed judgment(s)"))
    if step.since_last_fault_s > STEP_BOUND_S:
        out.append(("bound", f"{name}: done {step.since_last_fault_s:.1f} s after its post or last fault"))
    return out


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
                if "answer" in (ta.get("type"), tb.get("type")):
                    continue  # the final turn has no credit of its own
                if (ta["credit"] is None) != (tb["credit"] is None):
                    return float("inf")
                if tb["credit"] is not None:
                    worst = max(worst, abs(ta["credit"] - tb["credit"]))
    return worst


class FinalAnnouncements(threading.Thread):
    """Counts the ``drcredit_group_final`` notifications of each group (LISTEN on its own
    connection, again after each Postgres restart): two for one group is a group finished
    twice. One sent while this listener was away is missed, never counted twice."""

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
                return conn.execute(sql, params).fetchall()
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


#: A batch's groups as stored: a second aggregation would stamp ``finished_at`` again.
STORED = (
    "SELECT g.group_id, g.status, g.aggregation, g.finished_at, md5(coalesce(g.advantages_json::text, ''))"
    " FROM groups AS g JOIN batches AS b ON g.batch_pk = b.id WHERE b.batch_id = %s ORDER BY g.group_id"
)
DUPLICATE_JUDGMENTS = (
    "SELECT count(*) FROM (SELECT 1 FROM judgments GROUP BY group_pk, kind, rollout_id, turn_index, rubric_id"
    " HAVING count(*) > 1) AS d"
)
OPEN_UNITS = "SELECT status, count(*) FROM work_units WHERE status IN ('queued', 'running', 'waiting') GROUP BY status"
FAILED = "SELECT failure_reason, count(*) FROM judgments WHERE status = 'failed' GROUP BY failure_reason"


def database_violations(
    conninfo: str, snapshots: dict[str, list[tuple[Any, ...]]], announced: Counter[int]
) -> list[tuple[str, str]]:
    """(check, what went wrong) of the whole database once the faults have stopped."""
    out: list[tuple[str, str]] = []
    for batch_id, before in snapshots.items():
        after = query(conninfo, STORED, (batch_id,))
        if after != before:
            changed = [b[0] for b, c in zip(before, after, strict=False) if b != c] or ["(groups added or lost)"]
            out.append(("twice", f"{batch_id}: stored results changed after the step ended: {changed}"))
        not_done = [row[0] for row in after if row[1] != "done" or row[2] != "done"]
        if not_done:
            out.append(("lost", f"{batch_id}: groups not done: {not_done}"))
    names = dict(query(conninfo, "SELECT id, group_id FROM groups"))
    twice = {names.get(pk, pk): n for pk, n in announced.items() if n > 1}
    if twice:
        out.append(("twice", f"groups announced final more than once: {twice}"))
    duplicates = query(conninfo, DUPLICATE_JUDGMENTS)[0][0]
    if duplicates:
        out.append(("twice", f"{duplicates} judgment key(s) stored more than once"))
    failed = query(conninfo, FAILED)
    if failed:
        out.append(("failed", f"failed judgments stored: {dict(failed)}"))
    open_units = query(conninfo, OPEN_UNITS)
    if open_units:
        out.append(("lost", f"work units left open: {dict(open_units)}"))
    return out
