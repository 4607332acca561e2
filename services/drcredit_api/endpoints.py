"""The routes of API.md. Each handler validates, calls the pipeline, shapes the answer."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import func, select

from drcredit import metrics
from drcredit.domain.batch import BatchIn
from drcredit.domain.group import GroupIn, Rollout, is_valid_group_id
from drcredit.scoring import documents
from drcredit.scoring.errors import NotFound, NotReady, Unavailable
from drcredit.scoring.outages import endpoint_states
from drcredit.scoring.replay import replay
from drcredit.scoring.runtime import Runtime
from drcredit.storage import models as m
from drcredit_api import schemas
from drcredit_api.auth import tenant_of

T = TypeVar("T")
Tenant = Annotated[str, Depends(tenant_of)]
Wait = Annotated[float, Query(ge=0, description="Long-poll up to this many seconds for the group to finish")]

router = APIRouter()

_ERRORS: dict[int, dict[str, Any]] = {
    401: {"model": schemas.ErrorBody, "description": "Missing or invalid API key"},
    404: {"model": schemas.ErrorBody, "description": "No such group or batch for this tenant"},
    409: {
        "model": schemas.ErrorBody,
        "description": "Conflicting re-post (what differs), or not done yet (its status)",
    },
    413: {"model": schemas.ErrorBody, "description": "Body larger than DRCREDIT_MAX_BODY_BYTES"},
    415: {"model": schemas.ErrorBody, "description": "The body is not sent as application/json"},
    422: {"model": schemas.ErrorBody, "description": "Invalid input; each error names its field"},
    503: {"model": schemas.ErrorBody, "description": "Database away or schema behind this release (see Retry-After)"},
}


def answers(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error answers an endpoint can give, for its OpenAPI description."""
    return {code: _ERRORS[code] for code in (401, *codes, 503)}


INGEST = answers(409, 413, 415, 422)
READ = answers(404)
RESULT = answers(404, 409, 422)


def runtime_of(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    if runtime.schema_problem:
        raise Unavailable(runtime.schema_problem, retry_after_s=30)
    return runtime


RuntimeDep = Annotated[Runtime, Depends(runtime_of)]


def _links(group_id: str) -> dict[str, str]:
    base = f"/v1/groups/{group_id}"
    return {
        "status": base,
        "advantages": f"{base}/advantages",
        "credits": f"{base}/credits",
        "rollouts": f"{base}/rollouts",
    }


async def read_db(rt: Runtime, fn: Callable[[Any], T], *, writes: bool = False) -> T:
    """Run ``fn`` with a session on a worker thread: a read-only one unless it ``writes``."""

    def run() -> T:
        with rt.db.session() if writes else rt.db.read_session() as s:
            return fn(s)

    return await run_in_threadpool(run)


FINAL = ("done", "failed")


async def _wait_until_final(rt: Runtime, statuses: Callable[[Any], dict[int, str]], wait: float) -> None:
    """Long-poll: return once every group is final, or when the wait runs out.

    The statuses are read again only when the groups are reported finished (see
    :mod:`drcredit.scoring.events`), or after the events' recheck interval.
    """
    deadline = time.monotonic() + min(wait, rt.settings.max_wait_s)
    events = rt.pipeline.events

    def pending(current: dict[int, str]) -> list[int]:
        return [pk for pk, status in current.items() if status not in FINAL]

    current = await read_db(rt, statuses)
    while pending(current) and time.monotonic() < deadline:
        with events.watching(pending(current)) as subscription:
            # Read again once subscribed: a group finished in between is seen here.
            current = await read_db(rt, statuses)
            if pending(current):
                await events.wait(subscription, deadline - time.monotonic())
                current = await read_db(rt, statuses)


# ---------------------------------------------------------------------------- ingest


@router.post("/v1/groups", status_code=202, response_model=schemas.Accepted, responses=INGEST, tags=["ingest"])
async def post_group(group: GroupIn, tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """Submit one rollout group (or open a streaming group with ``expected_rollouts``)."""
    sub = await run_in_threadpool(rt.pipeline.submit_group, tenant, group)
    return {"group_id": sub.group_id, "status": sub.status, "created": sub.created, "links": _links(sub.group_id)}


@router.post(
    "/v1/groups/{group_id}/rollouts",
    status_code=202,
    response_model=schemas.RolloutAccepted,
    responses=answers(404, 409, 413, 415, 422),
    tags=["ingest"],
)
async def post_rollout(group_id: str, rollout: Rollout, tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """Add one rollout to a streaming group; its judging starts at once."""
    _, created = await run_in_threadpool(rt.pipeline.add_rollout, tenant, group_id, rollout)

    def state(s: Any) -> m.Group:
        return documents.find_group(s, tenant, group_id)

    row = await read_db(rt, state)
    return {
        "group_id": group_id,
        "rollout_id": rollout.id,
        "status": row.status,
        "created": created,
        "rollouts_received": row.rollouts_received,
        "expected_rollouts": row.expected_rollouts,
    }


@router.post("/v1/batches", status_code=202, response_model=schemas.BatchAccepted, responses=INGEST, tags=["ingest"])
async def post_batch(batch: BatchIn, tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """Submit a training step's groups in one call.

    Every check runs before anything is stored; each group is then stored atomically and
    starts judging at once, and the batch is visible once all its groups are in.
    Re-posting the same batch_id is idempotent.
    """
    batch_id, subs, created = await run_in_threadpool(rt.pipeline.submit_batch, tenant, batch)
    return {
        "batch_id": batch_id,
        "group_ids": [s.group_id for s in subs],
        "created": created,
        "links": {"status": f"/v1/batches/{batch_id}", "advantages": f"/v1/batches/{batch_id}/advantages"},
    }


# ---------------------------------------------------------------------------- results


@router.get("/v1/groups/{group_id}", response_model=schemas.GroupStatus, responses=READ, tags=["results"])
async def get_group(group_id: str, tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """Status and judging progress of a group."""
    return await read_db(rt, lambda s: documents.status_document(s, documents.find_group(s, tenant, group_id)))


def _group_statuses(tenant: str, group_id: str) -> Callable[[Any], dict[int, str]]:
    def statuses(s: Any) -> dict[int, str]:
        if not is_valid_group_id(group_id):
            raise NotFound(f"group {group_id!r} not found")
        row = s.execute(
            select(m.Group.id, m.Group.status).where(m.Group.tenant == tenant, m.Group.group_id == group_id)
        ).one_or_none()
        if row is None:
            raise NotFound(f"group {group_id!r} not found")
        return {row.id: row.status}

    return statuses


@router.get(
    "/v1/groups/{group_id}/advantages", response_model=schemas.AdvantagesDocument, responses=RESULT, tags=["results"]
)
async def get_advantages(group_id: str, tenant: Tenant, rt: RuntimeDep, wait: Wait = 0.0) -> dict[str, Any]:
    """Per-turn advantages once the group is done; ``409`` with its status before that."""
    await _wait_until_final(rt, _group_statuses(tenant, group_id), wait)
    return await read_db(
        rt, lambda s: documents.advantages_document(s, documents.find_group(s, tenant, group_id, full=True))
    )


@router.get("/v1/groups/{group_id}/credits", response_model=schemas.CreditsDocument, responses=RESULT, tags=["results"])
async def get_credits(group_id: str, tenant: Tenant, rt: RuntimeDep, wait: Wait = 0.0) -> dict[str, Any]:
    """The breakdown behind the advantages: credit parts, judgments, support histories."""
    await _wait_until_final(rt, _group_statuses(tenant, group_id), wait)
    return await read_db(
        rt, lambda s: documents.credits_document(s, documents.find_group(s, tenant, group_id, full=True))
    )


@router.post(
    "/v1/groups/{group_id}/replay",
    response_model=schemas.ReplayDocument,
    responses=answers(404, 409, 413, 415, 422),
    tags=["results"],
)
async def post_replay(group_id: str, body: schemas.ReplayRequest, tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """Advantages recomputed from stored judgments under other parameters (no judge call)."""

    def run(s: Any) -> dict[str, Any]:
        group = documents.find_group(s, tenant, group_id)
        result = replay(s, group, body.params)
        s.add(m.Replay(group_pk=group.id, params=result["params"], result=result))
        return result

    return await read_db(rt, run, writes=True)


def _batch_groups(s: Any, tenant: str, batch_id: str) -> list[m.Group]:
    batch = documents.find_batch(s, tenant, batch_id)
    rows = {
        g.group_id: g
        for g in s.scalars(select(m.Group).where(m.Group.tenant == tenant, m.Group.group_id.in_(batch.group_ids)))
    }
    return [rows[g] for g in batch.group_ids]


def _batch_statuses(s: Any, tenant: str, batch_id: str) -> dict[int, str]:
    """The groups' statuses alone, by group row id (what the long-poll waits on)."""
    group_ids = documents.find_batch(s, tenant, batch_id).group_ids
    rows = s.execute(
        select(m.Group.id, m.Group.status).where(m.Group.tenant == tenant, m.Group.group_id.in_(group_ids))
    )
    return {pk: status for pk, status in rows}


def _batch_status(groups: list[m.Group]) -> str:
    statuses = {g.status for g in groups}
    if statuses <= {"done"}:
        return "done"
    if statuses <= {"done", "failed"}:
        return "failed"
    return "running" if statuses - {"queued"} else "queued"


@router.get("/v1/batches/{batch_id}", response_model=schemas.BatchStatus, responses=READ, tags=["results"])
async def get_batch(batch_id: str, tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """Status of every group of a batch."""

    def run(s: Any) -> dict[str, Any]:
        groups = _batch_groups(s, tenant, batch_id)
        return {
            "batch_id": batch_id,
            "status": _batch_status(groups),
            "groups": [documents.status_document(s, g) for g in groups],
        }

    return await read_db(rt, run)


@router.get(
    "/v1/batches/{batch_id}/advantages", response_model=schemas.BatchAdvantages, responses=RESULT, tags=["results"]
)
async def get_batch_advantages(batch_id: str, tenant: Tenant, rt: RuntimeDep, wait: Wait = 0.0) -> dict[str, Any]:
    """Advantages of every group of a batch; ``409`` until every group has finished.

    A failed group appears with its status and error in place of its advantages.
    """
    await _wait_until_final(rt, lambda s: _batch_statuses(s, tenant, batch_id), wait)

    def run(s: Any) -> dict[str, Any]:
        groups = _batch_groups(s, tenant, batch_id)
        pending = [g for g in groups if g.status not in ("done", "failed")]
        if pending:
            raise NotReady(
                _batch_status(groups), f"batch {batch_id!r}: {len(pending)} of {len(groups)} groups not finished"
            )
        done = documents.advantages_documents(s, tenant, [g.group_id for g in groups if g.status == "done"])
        docs = [
            done[g.group_id] if g.status == "done" else {"group_id": g.group_id, "status": g.status, "error": g.error}
            for g in groups
        ]
        return {"batch_id": batch_id, "status": _batch_status(groups), "groups": docs}

    return await read_db(rt, run)


# ---------------------------------------------------------------------------- operations


@router.get("/healthz", tags=["operations"])
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    tags=["operations"],
    responses={503: {"description": "Database or broker unreachable, or the schema behind this release"}},
)
async def readyz(request: Request) -> Response:
    """Ready to ingest: database reachable with its schema at head, broker reachable.

    The judge is reported as a component (``judge``: each endpoint's last known state,
    from the processes that call it) without making the API unready: groups posted
    while the judge is down wait for it.
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
    judges: list[dict[str, Any]] = []
    if checks["database"] == "ok" and not rt.schema_problem:
        try:
            judges = await read_db(rt, endpoint_states)
        except Exception:  # noqa: BLE001 - the judge's state is informative only
            judges = []
    down = [j for j in judges if j["state"] == "down"]
    checks["judge"] = {"state": "down" if down else "up", "endpoints": judges}
    return JSONResponse(
        status_code=200 if ready else 503, content={"status": "ready" if ready else "not ready", **checks}
    )


@router.get("/metrics", tags=["operations"], response_class=PlainTextResponse)
async def prometheus_metrics(rt: RuntimeDep) -> Response:
    """Prometheus text format."""

    def counts(s: Any) -> dict[str, int]:
        return dict(s.execute(select(m.Group.status, func.count()).group_by(m.Group.status)).all())

    try:
        by_status = await read_db(rt, counts)
        for status in ("queued", "running", "done", "failed"):
            metrics.GROUPS_BY_STATUS.labels(status).set(by_status.get(status, 0))
    except Exception:  # noqa: BLE001 - metrics must answer even when the database does not
        pass
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
