"""What ``/metrics`` reads from the database when it is scraped: steps in flight, each
recent run's latest finished step (its wall time, and ``drcredit_run_drift`` and
``drcredit_run_drift_flagged`` per kind), and groups left open after their judgments.

Computed here, in the API, rather than by the workers as steps finish: a run's levels
come from every worker that judged it, so only a reader of the database sees them whole;
a worker's gauge would go stale with the worker (or disagree with another's), while every
API replica reads the same rows and exports the same value. The read is bounded (each
recent run's first three steps and its latest finished step) and made at most once per
:data:`REFRESH_S` per app, whatever the scrape rate.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import Request
from sqlalchemy import case, func, select

from drcredit import metrics
from drcredit.analytics.recent_steps import RecentSteps, recent_steps
from drcredit.storage import models as m
from drcredit.wiring.runtime import Runtime
from drcredit_api.endpoints import read_db

#: Seconds a reading serves scrapes before the database is read again.
REFRESH_S = 30.0
#: An open group whose work units all finished longer ago than this is counted as left open.
LEFT_OPEN_AFTER_S = 300.0


def groups_judged_not_done(s: Any, now: datetime | None = None) -> int:
    """Queued or running groups with work units, all done, the last more than
    :data:`LEFT_OPEN_AFTER_S` ago: their judgments are in, their advantages are not."""
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=LEFT_OPEN_AFTER_S)
    left_open = (
        select(m.Group.id)
        .join(m.WorkUnit, m.WorkUnit.group_pk == m.Group.id)
        .where(m.Group.status.in_(("queued", "running")))
        .group_by(m.Group.id)
        .having(
            func.sum(case((m.WorkUnit.status != "done", 1), else_=0)) == 0,
            func.max(m.WorkUnit.updated_at) < cutoff,
        )
    ).subquery()
    return int(s.scalar(select(func.count()).select_from(left_open)) or 0)


async def update_run_metrics(request: Request, rt: Runtime) -> None:
    state = request.app.state
    now = time.monotonic()
    last = getattr(state, "run_metrics_at", None)
    if last is not None and now - last < REFRESH_S:
        return
    settings = rt.settings

    def read(s: Any) -> tuple[RecentSteps, int]:
        return recent_steps(s, settings.drift_metrics_window_s, settings.drift_threshold), groups_judged_not_done(s)

    recent, left_open = await read_db(rt, read)
    state.run_metrics_at = now
    metrics.STEPS_IN_FLIGHT.set(recent.in_flight)
    metrics.GROUPS_JUDGED_NOT_DONE.set(left_open)
    # A run that left the window (or a kind without a value now) stops being exported.
    for gauge in (metrics.RUN_LATEST_STEP_SECONDS, metrics.RUN_DRIFT, metrics.RUN_DRIFT_FLAGGED):
        gauge.clear()
    for run in recent.runs:
        if run.latest_step_seconds is not None:
            metrics.RUN_LATEST_STEP_SECONDS.labels(run.tenant, run.run).set(run.latest_step_seconds)
        for d in run.drift:
            metrics.RUN_DRIFT.labels(run.tenant, run.run, d.kind).set(d.drift)
            metrics.RUN_DRIFT_FLAGGED.labels(run.tenant, run.run, d.kind).set(1 if d.flagged else 0)
