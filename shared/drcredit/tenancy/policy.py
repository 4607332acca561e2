"""The operator's tenants (``DRCREDIT_TENANTS``): weight, largest share, burst, budgets.

A JSON object keyed by tenant (the names of ``DRCREDIT_API_KEYS``); every field is
optional and a tenant not named gets :data:`DEFAULT_POLICY` (weight 1, no cap, no
budget). A bad value refuses to start, naming the setting, the tenant and the field.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

#: The setting the policies come from, named in every error about one.
TENANTS_SETTING = "DRCREDIT_TENANTS"

BudgetName = Literal["tokens_per_day", "tokens_per_month", "usd_per_day", "usd_per_month"]
#: Every budget, in the order a check reports them.
BUDGETS: tuple[BudgetName, ...] = ("tokens_per_day", "usd_per_day", "tokens_per_month", "usd_per_month")


class Budget(BaseModel):
    """Most judge tokens (prompt + completion) and USD a tenant may use per UTC day and month."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens_per_day: int | None = Field(None, ge=0)
    tokens_per_month: int | None = Field(None, ge=0)
    usd_per_day: float | None = Field(None, ge=0, allow_inf_nan=False)
    usd_per_month: float | None = Field(None, ge=0, allow_inf_nan=False)

    def limits(self) -> dict[BudgetName, float]:
        """The budgets set, by name."""
        return {name: float(v) for name in BUDGETS if (v := getattr(self, name)) is not None}


class Burst(BaseModel):
    """A higher weight while an allowance of seconds lasts (:mod:`drcredit.tenancy.burst`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The tenant's weight while its allowance lasts.
    weight: float = Field(gt=0, allow_inf_nan=False)
    #: The allowance: spent while the tenant has calls, earned back while it has none.
    seconds: float = Field(gt=0, allow_inf_nan=False)


class TenantPolicy(BaseModel):
    """One tenant's part of the judge fleet and what it may spend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Its share of the fleet while others wait too, relative to theirs.
    weight: float = Field(1.0, gt=0, allow_inf_nan=False)
    #: The largest part of the fleet's capacity it may hold, even alone.
    max_share: float = Field(1.0, gt=0, le=1)
    #: A higher weight while its allowance lasts (none: always ``weight``).
    burst: Burst | None = None
    budget: Budget = Budget()
    #: A request past a budget: refused (429) or accepted and held until the window resets.
    on_budget: Literal["refuse", "wait"] = "refuse"
    #: Its key also reads every tenant's usage (the deployment's operator).
    operator: bool = False

    @model_validator(mode="after")
    def _burst_raises(self) -> TenantPolicy:
        if self.burst is not None and self.burst.weight <= self.weight:
            raise ValueError(
                f"burst.weight {self.burst.weight:g} is not above weight {self.weight:g} (a burst raises the weight)"
            )
        return self


DEFAULT_POLICY = TenantPolicy()


def parse_tenants(raw: str | Mapping[str, Any] | None, known: Collection[str] | None = None) -> dict[str, TenantPolicy]:
    """The policies of ``DRCREDIT_TENANTS``; ValueError naming the tenant and field.

    ``known``: the tenants of the configured keys (None: keys not configured); a policy
    for a tenant no key belongs to is refused (a misspelt name would be silently unused).
    """
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{TENANTS_SETTING}: not JSON ({exc.msg} at {exc.pos})") from None
    else:
        body = raw
    if not isinstance(body, Mapping):
        raise ValueError(f"{TENANTS_SETTING}: expected a JSON object keyed by tenant, got {type(body).__name__}")
    out: dict[str, TenantPolicy] = {}
    for tenant, fields in body.items():
        if known is not None and tenant not in known:
            raise ValueError(
                f"{TENANTS_SETTING}.{tenant}: no key of DRCREDIT_API_KEYS belongs to this tenant"
                f" (tenants: {', '.join(sorted(known)) or 'none'})"
            )
        try:
            out[tenant] = TenantPolicy.model_validate(fields if fields is not None else {})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            got = first.get("input")
            raise ValueError(
                f"{TENANTS_SETTING}.{tenant}{'.' + where if where else ''}:"
                f" {first['msg'].removeprefix('Value error, ')} (got {got!r})"
            ) from None
    return out


def policy_of(policies: Mapping[str, TenantPolicy], tenant: str) -> TenantPolicy:
    return policies.get(tenant, DEFAULT_POLICY)
