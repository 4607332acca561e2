"""The budget check the ingest routes and ``POST /v1/audits`` run before storing new
work that calls the judge (:mod:`drcredit.tenancy.budgets`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select

from drcredit.scoring.intake.ingest import Hold
from drcredit.tenancy import budgets
from drcredit.tenancy.policy import policy_of
from drcredit.wiring.runtime import Runtime


async def budget_hold(rt: Runtime, tenant: str, existing: tuple[type[Any], str, str] | None = None) -> Hold | None:
    """The check before new groups or judge audits are stored: None (go), a hold
    (``on_budget: wait``), or :class:`~drcredit.tenancy.budgets.BudgetExhausted` (a 429).
    ``existing``: (model, column, id) of what a re-post would find stored; a re-post is
    answered as before."""
    settings = rt.settings
    if not policy_of(settings.tenants, tenant).budget.limits():
        return None

    def check(s: Any) -> Hold | None:
        if existing is not None:
            model, column, value = existing
            if s.scalar(select(model.id).where(model.tenant == tenant, getattr(model, column) == value)) is not None:
                return None
        return budgets.admit(
            s, tenant, settings.tenants, settings.judge_price, datetime.now(UTC), settings.budget_window_s
        )

    def run() -> Hold | None:
        with rt.db.read_session() as s:
            return check(s)

    return await run_in_threadpool(run)
