"""Judge audits (docs/audit.md): start one over a run, a batch or a list of groups, read
it (long-poll ``wait``), list them. Tenant-scoped like every ``/v1`` route; the audit
judges are the operator's (``DRCREDIT_AUDIT_JUDGES``), named in the request only."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from drcredit.audit import service
from drcredit.audit.schemas import HUMAN, AuditRequest
from drcredit.domain.text import Text
from drcredit.scoring.errors import NotReady
from drcredit_api import audit_schemas
from drcredit_api.budget_gate import budget_hold
from drcredit_api.endpoints import INGEST, READ, RESULT, RuntimeDep, Tenant, Wait, answers, read_db

router = APIRouter(tags=["audits"])

#: How often a long-poll reads an audit again while it runs.
POLL_S = 0.25


@router.post("/v1/audits", status_code=202, response_model=audit_schemas.AuditSummary, responses=INGEST)
async def post_audit(request: AuditRequest, tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """Re-score a sample of done groups with an audit judge and compare (202: queued, or
    ``waiting_for_budget`` past a budget with ``on_budget: wait``; 429 with ``refuse``).
    An audit against people's labels calls no judge: no budget applies."""
    hold = None if request.judge == HUMAN else await budget_hold(rt, tenant)
    return await run_in_threadpool(service.start, rt.db, rt.audits, tenant, request, rt.dispatcher.dispatch_audit, hold)


@router.get("/v1/audits", response_model=audit_schemas.AuditList, responses=answers())
async def list_audits(
    tenant: Tenant,
    rt: RuntimeDep,
    run: Annotated[Text | None, Query(max_length=128, description="Only audits over this run's groups")] = None,
) -> dict[str, Any]:
    """The tenant's audits, newest first, with each done one's headline figures."""
    return {"audits": await read_db(rt, lambda s: service.listing(s, tenant, run))}


@router.get("/v1/audits/{audit_id}", response_model=audit_schemas.AuditDocument, responses=RESULT)
async def get_audit(audit_id: str, tenant: Tenant, rt: RuntimeDep, wait: Wait = 0) -> dict[str, Any]:
    """The audit's report once done; ``409`` with its status (and a failure's reason) until then."""
    deadline = time.monotonic() + min(wait, rt.settings.max_wait_s)
    while True:
        row = await read_db(rt, lambda s: service.find(s, tenant, audit_id))
        try:
            return service.document(row)
        except NotReady:
            if row.status == "failed" or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


__all__ = ["READ", "router"]
