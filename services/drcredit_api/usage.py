"""Who used what: ``GET /v1/usage`` for the key's tenant, and every tenant's for the
deployment's operator (a tenant marked ``operator`` in DRCREDIT_TENANTS)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select

from drcredit.domain.text import Text
from drcredit.storage import models as m
from drcredit.tenancy import budgets
from drcredit.tenancy.policy import policy_of
from drcredit.wiring.runtime import Runtime
from drcredit_api import usage_schemas
from drcredit_api.auth import OPEN_TENANT
from drcredit_api.endpoints import RuntimeDep, Tenant, answers, read_db
from drcredit_api.errors import Forbidden

router = APIRouter(tags=["usage"])
log = logging.getLogger("drcredit.api")


def is_operator(rt: Runtime, request: Request, tenant: str) -> bool:
    """The deployment's operator: a tenant marked ``operator`` in DRCREDIT_TENANTS (or
    anyone when the API runs open, without keys)."""
    if not request.app.state.tenant_keys and tenant == OPEN_TENANT:
        return True
    return policy_of(rt.settings.tenants, tenant).operator


def share_last_minute(rt: Runtime) -> dict[str, float]:
    """Each tenant's share of the judge calls served over the last minute, from every
    live process's report of the fleet."""
    fleet = getattr(rt.judge, "fleet", None)
    if fleet is None:
        return {}
    served: dict[str, int] = dict(fleet.shares.served_last_minute())  # this process's, as of now
    try:
        for report in fleet.store.reports():
            if report.process != fleet.process:
                for tenant, n in report.served.items():
                    served[tenant] = served.get(tenant, 0) + n
    except Exception:
        log.warning("could not read the other processes' judge calls", exc_info=True)
    total = sum(served.values())
    return {t: n / total for t, n in served.items()} if total else {}


def tenant_document(rt: Runtime, s: Any, tenant: str, shares: dict[str, float]) -> dict[str, Any]:
    settings = rt.settings
    report = budgets.read_usage(
        s,
        tenant,
        policy_of(settings.tenants, tenant),
        settings.judge_price,
        datetime.now(UTC),
        settings.budget_window_s,
    )
    budgets.export(tenant, report.budgets)
    return budgets.usage_document(report, settings.judge_price, shares.get(tenant, 0.0) if shares else None)


def known_tenants(rt: Runtime, request: Request, s: Any) -> list[str]:
    """Every tenant with a key, a policy or groups."""
    named = set(request.app.state.tenant_keys.values()) | set(rt.settings.tenants)
    named.update(s.scalars(select(m.Group.tenant).distinct()))
    return sorted(named)


@router.get("/v1/usage", response_model=usage_schemas.OwnUsageDocument, responses=answers(403, 404))
async def get_usage(
    request: Request,
    tenant: Tenant,
    rt: RuntimeDep,
    of: Annotated[
        Text | None, Query(alias="tenant", max_length=128, description="Another tenant (operator keys only)")
    ] = None,
) -> dict[str, Any]:
    """The key's tenant's judge usage today and this month (UTC), its share of the fleet's
    calls over the last minute, and each budget with what is left; ``operator`` says
    whether the key may read every tenant's (so the viewer asks only then)."""
    target = tenant
    operator = is_operator(rt, request, tenant)
    if of is not None and of != tenant:
        if not operator:
            raise Forbidden("tenant", "only the operator's key reads another tenant's usage")
        target = of
    shares = await run_in_threadpool(share_last_minute, rt)
    document = await read_db(rt, lambda s: tenant_document(rt, s, target, shares))
    return {**document, "operator": operator}


@router.get("/v1/usage/tenants", response_model=usage_schemas.TenantUsageList, responses=answers(403))
async def get_all_usage(request: Request, tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """Every tenant's usage (the operator's key only)."""
    if not is_operator(rt, request, tenant):
        raise Forbidden("authorization", "only the operator's key reads every tenant's usage")
    shares = await run_in_threadpool(share_last_minute, rt)

    def read(s: Any) -> dict[str, Any]:
        return {"tenants": [tenant_document(rt, s, t, shares) for t in known_tenants(rt, request, s)]}

    return await read_db(rt, read)


__all__ = ["router"]
