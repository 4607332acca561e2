"""The routes of the REST API (docs/api.md). Each handler validates, calls the pipeline, shapes the answer."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select

from drcredit.domain.batch import BatchIn
from drcredit.domain.group import GroupIn, Rollout, is_valid_group_id
from drcredit.domain.usage import total
from drcredit.scoring.errors import NotFound, NotReady, Unavailable
from drcredit.scoring.results import breakdown, documents
from drcredit.scoring.results.replay import replay
from drcredit.scoring.results.usage import group_usage
from drcredit.storage import models as m
from drcredit.tenancy.windows import held_for_budget
from drcredit.wiring.runtime import Runtime
from drcredit_api import queues, schemas, usage_schemas
from drcredit_api.auth import tenant_of
from drcredit_api.budget_gate import budget_hold

T = TypeVar("T")
Tenant = Annotated[str, Depends(tenant_of)]
Wait = Annotated[float, Query(ge=0, description="Long-poll up to this many seconds for the group to finish")]

router = APIRouter()
log = logging.getLogger("drcredit.api")

_ERRORS: dict[int, dict[str, Any]] = {
    401: {"model": schemas.ErrorBody, "description": "Missing or invalid API key"},
    404: {"model": schemas.ErrorBody, "description": "No such group or batch for this tenant"},
    409: {
        "model": schemas.ErrorBody,
        "description": "Conflicting re-post (what differs), or not done yet (its status)",
    },
    413: {"model": schemas.ErrorBody, "description": "Body larger than DRCREDIT_MAX_BODY_BYTES"},
    403: {"model": schemas.ErrorBody, "description": "The key's tenant may not read this"},
    415: {"model": schemas.ErrorBody, "description": "The body is not sent as application/json"},
    422: {"model": schemas.ErrorBody, "description": "Invalid input; each error names its field"},
    429: {
        "model": usage_schemas.BudgetExhaustedBody,
        "description": "A budget of the tenant is used up (on_budget: refuse); see Retry-After",
    },
    503: {"model": schemas.ErrorBody, "description": "Database away or schema behind this release (see Retry-After)"},
}


def answers(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error answers an endpoint can give, for its OpenAPI description."""
    return {code: _ERRORS[code] for code in (401, *codes, 503)}


INGEST = answers(409, 413, 415, 422, 429)
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
        # The group's page in the credit viewer (docs/viewer.md).
        "viewer": f"/ui/groups/{group_id}",
    }


async def read_db(rt: Runtime, fn: Callable[[Any], T], *, writes: bool = False) -> T:
    """Run ``fn`` with a session on a worker thread: a read-only one unless it ``writes``."""

    def run() -> T:
        with rt.db.session() if writes else rt.db.read_session() as s:
            return fn(s)

    return await run_in_threadpool(run)


FINAL = ("done", "failed")

#: What a long-poll's read gives: the group row ids still running (then it may wait for
#: them), or the answer.
Polled = tuple[list[int], T | None]


async def _long_poll(rt: Runtime, wait: float, read: Callable[[Any, bool], Polled[T]]) -> T:
    """Answer once every group is final, or when the wait runs out (the answer then says
    what is not final: 409).

    ``read(session, may_wait)`` reads the groups' states and, when they are final or
    ``may_wait`` is false, the answer itself: in one session, so the read that sees the
    last group final is the one that answers. States are read again only when the
    groups are reported finished (:mod:`drcredit.scoring.results.events`) or after the
    events' recheck interval.
    """
    deadline = time.monotonic() + min(wait, rt.settings.max_wait_s)
    events = rt.pipeline.events

    def polled(may_wait: bool) -> Callable[[Any], Polled[T]]:
        return lambda s: read(s, may_wait)

    pending, answer = await read_db(rt, polled(time.monotonic() < deadline))
    while answer is None:
        with events.watching(pending) as subscription:
            # Read again once subscribed: a group finished in between is seen here, and
            # only the groups still running are waited for (one that finished before the
            # subscription was announced to nobody: waiting for its report would wait
            # out the recheck interval).
            pending, answer = await read_db(rt, polled(True))
            if answer is None:
                subscription.still_pending(pending)
                await events.wait(subscription, deadline - time.monotonic())
                pending, answer = await read_db(rt, polled(time.monotonic() < deadline))
    return answer


def _json(body: Any) -> Response:
    """An answer already in JSON (stored documents are served as they were stored)."""
    return Response(content=orjson.dumps(body), media_type="application/json")


# ---------------------------------------------------------------------------- ingest


@router.post("/v1/groups", status_code=202, response_model=schemas.Accepted, responses=INGEST, tags=["ingest"])
async def post_group(group: GroupIn, tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """Submit one rollout group (or open a streaming group with ``expected_rollouts``)."""
    hold = await budget_hold(rt, tenant, (m.Group, "group_id", group.group_id) if group.group_id else None)
    sub = await run_in_threadpool(functools.partial(rt.pipeline.submit_group, tenant, group, hold=hold))
    return {"group_id": sub.group_id, "status": sub.shown_status, "created": sub.created, "links": _links(sub.group_id)}


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
    hold = await budget_hold(rt, tenant, (m.Batch, "batch_id", batch.batch_id) if batch.batch_id else None)
    batch_id, subs, created = await run_in_threadpool(rt.pipeline.submit_batch, tenant, batch, hold)
    return {
        "batch_id": batch_id,
        "group_ids": [s.group_id for s in subs],
        "created": created,
        "links": {"status": f"/v1/batches/{batch_id}", "advantages": f"/v1/batches/{batch_id}/advantages"},
    }


# ---------------------------------------------------------------------------- results


@router.get("/v1/groups/{group_id}", response_model=schemas.GroupStatus, responses=READ, tags=["results"])
async def get_group(request: Request, group_id: str, tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """Status and judging progress of a group."""
    price = rt.settings.judge_price
    idle = await run_in_threadpool(queues.idle_queues, request)
    return await read_db(
        rt, lambda s: queues.status_document(s, documents.find_group(s, tenant, group_id), idle, price)
    )


def _one_group(tenant: str, group_id: str) -> Any:
    def state(s: Any) -> Any:
        rows = documents.final_states(s, tenant, [group_id]) if is_valid_group_id(group_id) else []
        if not rows:
            raise NotFound(f"group {group_id!r} not found")
        return rows[0]

    return state


@router.get(
    "/v1/groups/{group_id}/advantages", response_model=schemas.AdvantagesDocument, responses=RESULT, tags=["results"]
)
async def get_advantages(request: Request, group_id: str, tenant: Tenant, rt: RuntimeDep, wait: Wait = 0.0) -> Response:
    """Per-turn advantages once the group is done; ``409`` with its status before that
    (and, while its work waits on a queue no live worker consumes, which queue)."""
    state = _one_group(tenant, group_id)

    def read(s: Any, may_wait: bool) -> Polled[Response]:
        row = state(s)
        if row.status not in FINAL and may_wait:
            return [row.id], None
        queues.require_done(s, row, request)
        return [], _json(documents.final_advantages(s, tenant, [row], rt.settings.judge_price)[0])

    return await _long_poll(rt, wait, read)


@router.get("/v1/groups/{group_id}/credits", response_model=schemas.CreditsDocument, responses=RESULT, tags=["results"])
async def get_credits(group_id: str, tenant: Tenant, rt: RuntimeDep, wait: Wait = 0.0) -> dict[str, Any]:
    """The breakdown behind the advantages: credit parts, judgments, support histories."""
    state = _one_group(tenant, group_id)

    def read(s: Any, may_wait: bool) -> Polled[dict[str, Any]]:
        row = state(s)
        if row.status not in FINAL and may_wait:
            return [row.id], None
        return [], breakdown.credits_document(s, documents.find_group(s, tenant, group_id, full=True))

    return await _long_poll(rt, wait, read)


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


def _batch_status(groups: list[Any]) -> str:
    """done, failed (every group final, some failed), running, queued, or
    waiting_for_budget (every group held for the tenant's budget); of group rows or
    :func:`documents.final_states` rows."""
    statuses = {g.status for g in groups}
    if groups and all(held_for_budget(g.status, g.held_until) for g in groups):
        return "waiting_for_budget"
    if statuses <= {"done"}:
        return "done"
    if statuses <= {"done", "failed"}:
        return "failed"
    return "running" if statuses - {"queued"} else "queued"


@router.get("/v1/batches/{batch_id}", response_model=schemas.BatchStatus, responses=READ, tags=["results"])
async def get_batch(request: Request, batch_id: str, tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """Status of every group of a batch."""
    idle = await run_in_threadpool(queues.idle_queues, request)

    price = rt.settings.judge_price

    def run(s: Any) -> dict[str, Any]:
        groups = _batch_groups(s, tenant, batch_id)
        return {
            "batch_id": batch_id,
            "status": _batch_status(groups),
            "usage": total(group_usage(s, [g.id for g in groups]).values()).document(price),
            "groups": [queues.status_document(s, g, idle, price) for g in groups],
        }

    return await read_db(rt, run)


@router.get(
    "/v1/batches/{batch_id}/advantages", response_model=schemas.BatchAdvantages, responses=RESULT, tags=["results"]
)
async def get_batch_advantages(batch_id: str, tenant: Tenant, rt: RuntimeDep, wait: Wait = 0.0) -> Response:
    """Advantages of every group of a batch; ``409`` until every group has finished.

    A failed group appears with its status and error in place of its advantages.
    """

    def read(s: Any, may_wait: bool) -> Polled[Response]:
        rows = documents.final_states(s, tenant, documents.find_batch(s, tenant, batch_id).group_ids)
        pending = [r for r in rows if r.status not in FINAL]
        if pending and may_wait:
            return [r.id for r in pending], None
        if pending:
            raise NotReady(
                _batch_status(rows), f"batch {batch_id!r}: {len(pending)} of {len(rows)} groups not finished"
            )
        price = rt.settings.judge_price
        done = iter(documents.final_advantages(s, tenant, [r for r in rows if r.status == "done"], price))
        # A failed group's judge work was spent all the same.
        spent = group_usage(s, [r.id for r in rows if r.status != "done"])
        docs = [
            next(done)
            if r.status == "done"
            else {"group_id": r.group_id, "status": r.status, "error": r.error, "usage": spent[r.id].document(price)}
            for r in rows
        ]
        return [], _json({"batch_id": batch_id, "status": _batch_status(rows), "groups": docs})

    return await _long_poll(rt, wait, read)


# ---------------------------------------------------------------------------- operations
