"""The steps of recent runs as ``/metrics`` reports them: how many steps are in flight, and
for each run with recent groups its latest finished step's wall time and drift.

A step is *finished* when every group of it is done or failed; its wall time runs from
its first group's arrival to its last group's end. Only each run's first three steps and
its latest finished one are read for the drift, so a scrape's cost does not grow with a
run's length.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from drcredit.analytics.drift import levels_by_step, run_drift_section
from drcredit.domain.drift import BASELINE_STEPS
from drcredit.storage import models as m
from drcredit.storage.database import aware


@dataclass(frozen=True)
class DriftSample:
    kind: str
    drift: float
    flagged: bool


@dataclass(frozen=True)
class RecentRun:
    tenant: str
    run: str
    #: The latest finished step and its wall time (seconds); None before one finished.
    latest_step: int | None
    latest_step_seconds: float | None
    #: Per kind, the latest finished step's drift (after the first three steps; a kind
    #: without a judgment on either side has none).
    drift: list[DriftSample] = field(default_factory=list)


@dataclass(frozen=True)
class RecentSteps:
    #: (run, step) pairs, over every run, with a group neither done nor failed.
    in_flight: int
    runs: list[RecentRun]


@dataclass
class _Step:
    step: int
    finished: bool
    created: datetime
    ended: datetime | None


def recent_steps(s: Session, window_s: float, threshold: float, now: datetime | None = None) -> RecentSteps:
    """Steps in flight, and each run with a group created within ``window_s``."""
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=window_s)
    rows = s.execute(
        select(
            m.Group.tenant,
            m.Group.run,
            m.Group.step,
            func.count(),
            func.sum(case((m.Group.status.in_(("done", "failed")), 1), else_=0)),
            func.min(m.Group.created_at),
            func.max(m.Group.created_at),
            func.max(m.Group.finished_at),
        )
        .where(m.Group.run.is_not(None), m.Group.step.is_not(None))
        .group_by(m.Group.tenant, m.Group.run, m.Group.step)
    ).all()
    by_run: dict[tuple[str, str], list[_Step]] = defaultdict(list)
    latest: dict[tuple[str, str], datetime] = {}
    in_flight = 0
    for tenant, run, step, groups, final, first, last, ended in rows:
        finished = groups == int(final or 0)
        in_flight += not finished
        by_run[(tenant, run)].append(_Step(int(step), finished, aware(first), aware(ended) if ended else None))
        latest[(tenant, run)] = max(latest.get((tenant, run), aware(last)), aware(last))
    runs = []
    for (tenant, run), steps in sorted(by_run.items()):
        if latest[(tenant, run)] < cutoff:
            continue
        steps.sort(key=lambda x: x.step)
        done = [x for x in steps if x.finished]
        if not done:
            runs.append(RecentRun(tenant, run, None, None))
            continue
        last_step = done[-1]
        seconds = (last_step.ended - last_step.created).total_seconds() if last_step.ended else None
        drift = []
        if len(steps) > BASELINE_STEPS and last_step.step > steps[BASELINE_STEPS - 1].step:
            base = [x.step for x in steps[:BASELINE_STEPS]]
            section = run_drift_section(levels_by_step(s, tenant, run, [*base, last_step.step]), threshold)
            for kind, d in section.drift[last_step.step].items():
                if d["value"] is not None:
                    drift.append(DriftSample(kind, d["value"], d["flagged"]))
        runs.append(RecentRun(tenant, run, last_step.step, seconds, drift))
    return RecentSteps(in_flight, runs)
