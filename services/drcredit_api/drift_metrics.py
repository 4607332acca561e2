"""``drcredit_run_drift`` and ``drcredit_run_drift_flagged``, set when ``/metrics`` is scraped.

Computed here, in the API, from the database, rather than by the workers as steps
finish: a run's levels come from every worker that judged it, so only a reader of the
database sees them whole; a worker's gauge would go stale with the worker (or disagree
with another's), while every API replica reads the same rows and exports the same value.
The read is bounded (each recent run's first three steps and its latest finished step)
and made at most once per :data:`REFRESH_S` per app, whatever the scrape rate.
"""

from __future__ import annotations

import time

from fastapi import Request

from drcredit import metrics
from drcredit.analytics.drift import recent_drift
from drcredit.scoring.runtime import Runtime
from drcredit_api.endpoints import read_db

#: Seconds a reading serves scrapes before the database is read again.
REFRESH_S = 30.0


async def update_drift_metrics(request: Request, rt: Runtime) -> None:
    state = request.app.state
    now = time.monotonic()
    last = getattr(state, "drift_metrics_at", None)
    if last is not None and now - last < REFRESH_S:
        return
    settings = rt.settings
    samples = await read_db(rt, lambda s: recent_drift(s, settings.drift_metrics_window_s, settings.drift_threshold))
    state.drift_metrics_at = now
    # A run that left the window (or a kind without a value now) stops being exported.
    metrics.RUN_DRIFT.clear()
    metrics.RUN_DRIFT_FLAGGED.clear()
    for d in samples:
        metrics.RUN_DRIFT.labels(d.tenant, d.run, d.kind).set(d.drift)
        metrics.RUN_DRIFT_FLAGGED.labels(d.tenant, d.run, d.kind).set(1 if d.flagged else 0)
