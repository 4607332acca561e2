"""Response shapes of the tenants' usage and budgets (``GET /v1/usage``, a budget's 429)."""

from __future__ import annotations

from drcredit_api.schemas import Open, Usage


class BudgetLeft(Open):
    """One budget in its current window (UTC day or month)."""

    limit: float
    used: float
    left: float
    used_ratio: float
    resets_at: str


class TenantUsageDocument(Open):
    """``GET /v1/usage``: a tenant's judge usage, its share of the fleet, its budgets."""

    tenant: str
    day: Usage
    month: Usage
    #: Its share of the judge calls the fleet served over the last minute (null: no fleet).
    share_last_minute: float | None
    budgets: dict[str, BudgetLeft]


class OwnUsageDocument(TenantUsageDocument):
    """``GET /v1/usage``'s answer: the tenant's usage, and whether the asking key is the
    operator's (it may read every tenant's, ``GET /v1/usage/tenants``)."""

    operator: bool


class TenantUsageList(Open):
    tenants: list[TenantUsageDocument]


class BudgetExhaustedError(Open):
    code: str
    budget: str
    limit: float
    used: float
    resets_at: str


class BudgetExhaustedBody(Open):
    """A 429: new work past a budget of the tenant (``on_budget: refuse``)."""

    message: str
    error: BudgetExhaustedError
