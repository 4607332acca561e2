"""Operations routes: liveness, readiness (database, broker, the judge fleet, the queues)
and this process's Prometheus metrics."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import func, select

from drcredit import metrics
from drcredit.scoring.work.outages import endpoint_states
from drcredit.storage import models as m
from drcredit.wiring.runtime import Runtime
from drcredit_api import queues
from drcredit_api.endpoints import RuntimeDep, read_db
from drcredit_api.run_metrics import update_run_metrics

router = APIRouter()
log = logging.getLogger("drcredit.api")


@router.get("/healthz", tags=["operations"])
@router.head("/healthz", include_in_schema=False)  # uptime monitors ask with HEAD
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.head("/readyz", include_in_schema=False)
@router.get(
    "/readyz",
    tags=["operations"],
    responses={503: {"description": "Database or broker unreachable, or the schema behind this release"}},
)
async def readyz(request: Request) -> Response:
    """Ready to ingest: database reachable with its schema at head, broker reachable.

    The judge is reported as a component (``judge``: :func:`judge_status`) without
    making the API unready: groups posted while the judge is down wait for it. So are,
    in distributed mode, the queues (``queues``: which have no live consumer).
    """
    rt: Runtime = request.app.state.runtime
    checks: dict[str, Any] = {}
    try:
        await run_in_threadpool(rt.db.ping)
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        checks["database"] = f"unreachable: {type(exc).__name__}"
    if rt.schema_problem:
        checks["schema"] = rt.schema_problem
    probe = getattr(request.app.state, "broker_probe", None)
    if probe is None:
        checks["broker"] = "in-process"
    else:
        try:
            await run_in_threadpool(probe)
            checks["broker"] = "ok"
        except Exception as exc:  # noqa: BLE001
            checks["broker"] = f"unreachable: {type(exc).__name__}"
    ready = all(checks.get(k) in ("ok", "in-process") for k in ("database", "broker")) and not rt.schema_problem
    rows: list[dict[str, Any]] = []
    if checks["database"] == "ok" and not rt.schema_problem:
        try:
            rows = await read_db(rt, endpoint_states)
        except Exception:  # noqa: BLE001 - the judge's state is informative only
            rows = []
    checks["judge"] = await run_in_threadpool(judge_status, rt, rows)
    consumers = await run_in_threadpool(queues.readiness, request, rt, checks["database"] == "ok")
    if consumers is not None:
        checks["queues"] = consumers
    return JSONResponse(
        status_code=200 if ready else 503, content={"status": "ready" if ready else "not ready", **checks}
    )


def judge_status(rt: Runtime, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The judge for /readyz: ``down`` while it cannot be reached at all (its breaker
    open: work waits), ``degraded`` while some of its endpoints are out of the rotation,
    else ``up``; and each endpoint as the deployment's processes see it (in flight, the
    learned limit, latency, 429s, rate and context learned) with its recorded outages."""
    recorded = {r["endpoint"]: r for r in rows}
    fleet = rt.judge.fleet
    live: list[dict[str, Any]] = []
    if fleet is not None:
        try:
            live = fleet.status()
        except Exception:
            log.warning("could not read the judge fleet's state", exc_info=True)
            live = [{"endpoint": url, "state": "unknown"} for url in fleet.urls]
    endpoints = []
    for view in live:
        row = recorded.get(view["endpoint"], {})
        state = view["state"] if view["state"] not in ("idle", "unknown") else row.get("state", view["state"])
        endpoints.append({**view, **{k: v for k, v in row.items() if k != "state"}, "state": state})
    named = {e["endpoint"] for e in endpoints}
    endpoints += [r for r in rows if r["endpoint"] not in named and r["endpoint"] != rt.judge.endpoint]
    whole = recorded.get(rt.judge.endpoint)
    if whole is not None and whole["state"] == "down":
        overall = "down"
    elif any(e["state"] in ("down", "mixed") for e in endpoints):
        overall = "degraded"
    else:
        overall = "up"
    return {"state": overall, "endpoints": endpoints}


@router.head("/metrics", include_in_schema=False)
@router.get("/metrics", tags=["operations"], response_class=PlainTextResponse)
async def prometheus_metrics(request: Request, rt: RuntimeDep) -> Response:
    """Prometheus text format: this process's series.

    In distributed mode the pipeline's work is counted where it runs: judge calls,
    group latency, work units and tasks are series of the workers, each served on its
    ``DRCREDIT_METRICS_PORT`` (docs/operations.md, "Logs and metrics"). This endpoint
    adds what the API sees: requests, ingest, groups by status, each queue's
    messages, live consumers and groups waiting for a consumer, and what the database says
    of runs and steps (:mod:`drcredit_api.run_metrics`: steps in flight, each recent run's
    latest step time and drift, groups left open after their judgments).
    """

    def counts(s: Any) -> dict[str, int]:
        return dict(s.execute(select(m.Group.status, func.count()).group_by(m.Group.status)).all())

    try:
        by_status = await read_db(rt, counts)
        for status in ("queued", "running", "done", "failed"):
            metrics.GROUPS_BY_STATUS.labels(status).set(by_status.get(status, 0))
    except Exception:  # noqa: BLE001 - metrics must answer even when the database does not
        pass
    try:
        await update_run_metrics(request, rt)
    except Exception:  # metrics must answer even when the runs cannot be read
        log.warning("steps and runs not read for /metrics", exc_info=True)
    await run_in_threadpool(queues.update_metrics, request, rt)
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
