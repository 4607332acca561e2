"""Analytics routes: a group's evidence proxy, a training run's per-step series, a
batch's pooled sensitivity replay. Tenant-scoped like every ``/v1`` route; read-only
apart from nothing (no judge call, nothing stored)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from drcredit.analytics.evidence import evidence_document, parse_budgets
from drcredit.analytics.runs import list_runs, run_document
from drcredit.analytics.sensitivity import batch_sensitivity
from drcredit.scoring.results import documents
from drcredit_api import schemas
from drcredit_api.endpoints import READ, RESULT, RuntimeDep, Tenant, answers, read_db

router = APIRouter(tags=["analytics"])

Budgets = Annotated[
    str | None,
    Query(
        description="Comma-separated research-turn budgets b (default 2,4,...,14)",
        examples=["2,4,6,8,10,12,14"],
        max_length=1000,
    ),
]


@router.get("/v1/groups/{group_id}/evidence", response_model=schemas.EvidenceDocument, responses=RESULT)
async def get_evidence(group_id: str, tenant: Tenant, rt: RuntimeDep, budgets: Budgets = None) -> dict[str, Any]:
    """The evidence proxy (docs/method.md, "Evidence proxy"): C(b) and U(b) over the group's rollouts."""
    chosen = parse_budgets(budgets)
    return await read_db(rt, lambda s: evidence_document(s, documents.find_group(s, tenant, group_id), chosen))


@router.get("/v1/runs", response_model=schemas.RunList, responses=answers())
async def get_runs(tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """The tenant's training runs (groups posted with ``metadata.run``), newest first."""
    return await read_db(rt, lambda s: list_runs(s, tenant))


DriftThreshold = Annotated[
    float | None,
    Query(
        description="A step is flagged when its drift is above this (default DRCREDIT_DRIFT_THRESHOLD, 0.15)",
        ge=0,
        le=1,
        examples=[0.15],
    ),
]


@router.get("/v1/runs/{run}", response_model=schemas.RunDocument, responses=answers(404, 422))
async def get_run(
    run: str, tenant: Tenant, rt: RuntimeDep, budgets: Budgets = None, drift_threshold: DriftThreshold = None
) -> dict[str, Any]:
    """Per step of a run: groups and trajectories scored, judge calls and usage (tokens,
    cost) per trajectory, failures, scoring latency, credit, the evidence proxy, the
    distribution of A_rg, and the judge's levels with their drift from the run's first
    three steps; and the run's scoring workload row."""
    chosen = parse_budgets(budgets)
    threshold = rt.settings.drift_threshold if drift_threshold is None else drift_threshold
    price = rt.settings.judge_price
    return await read_db(rt, lambda s: run_document(s, tenant, run, chosen, price, threshold))


@router.get("/v1/batches/{batch_id}/sensitivity", response_model=schemas.SensitivityTable, responses=READ)
async def get_batch_sensitivity(batch_id: str, tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """The paper's sensitivity table pooled over the batch's done groups (no judge call)."""
    return await read_db(rt, lambda s: batch_sensitivity(s, documents.find_batch(s, tenant, batch_id)))


@router.post(
    "/v1/batches/{batch_id}/sensitivity",
    response_model=schemas.SensitivityScenario,
    responses=answers(404, 413, 415, 422),
)
async def post_batch_sensitivity(
    batch_id: str, body: schemas.ReplayRequest, tenant: Tenant, rt: RuntimeDep
) -> dict[str, Any]:
    """One scenario: the batch's done groups replayed under ``params``, pooled."""
    return await read_db(rt, lambda s: batch_sensitivity(s, documents.find_batch(s, tenant, batch_id), body.params))
