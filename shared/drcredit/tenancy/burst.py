"""A tenant's burst: a higher weight while an allowance of seconds lasts.

Weights alone give a short job beside a long batch its weight's part and no more: a
training step of 70 s that shares a 64-slot judge evenly with a batch takes twice as
long, and the trainer's GPUs wait for all of it. A tenant whose work comes in steps (a
trainer is idle while it trains) may be given a burst (``{"weight": W, "seconds": S}``):
while it has calls and its allowance lasts, it holds the fleet at weight ``W``; the
allowance is spent second for second while it has calls and comes back second for second
while it has none, up to ``S``. A tenant never idle spends it once. It is a two-piece
service curve (as HFSC's concave curves decouple a class's delay from its rate): over
any long stretch a tenant with calls all along still gets its weight's part.

Pure: the clock and the fleet's demand come from the caller, at every report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from drcredit.tenancy.policy import TenantPolicy, policy_of

#: The most of the time between two readings charged as busy: a process whose readings
#: stopped (its event loop idle) does not spend a tenant's allowance for the whole gap.
BUSY_CHARGE_MAX_S = 5.0


@dataclass
class _Allowance:
    left: float
    at: float
    busy: bool

    def advance(self, seconds: float, now: float, busy: bool) -> None:
        """Charge the time since the last reading by what the tenant was then (busy
        spends, idle earns), then note what it is now."""
        elapsed = max(0.0, now - self.at)
        spent = min(elapsed, BUSY_CHARGE_MAX_S) if self.busy else 0.0
        self.left = min(seconds, max(0.0, self.left - spent + (elapsed - spent)))
        self.at, self.busy = now, busy


class Bursts:
    """Each tenant's burst allowance, followed from the fleet's demand per tenant."""

    def __init__(self) -> None:
        self._allowances: dict[str, _Allowance] = {}

    def weights(
        self, policies: Mapping[str, TenantPolicy], demand: Mapping[str, float], now: float
    ) -> dict[str, float]:
        """Each tenant's weight now (every tenant of ``demand``): its burst weight while
        it has calls and allowance left, else its weight. A reading every fraction of a
        second follows the allowance within that fraction."""
        for tenant in set(self._allowances) | set(demand):
            burst = policy_of(policies, tenant).burst
            if burst is None:
                self._allowances.pop(tenant, None)
                continue
            # A tenant first seen has been idle since before this process knew it.
            a = self._allowances.setdefault(tenant, _Allowance(burst.seconds, now, False))
            a.advance(burst.seconds, now, demand.get(tenant, 0) > 0)
        return {tenant: self._weight(policy_of(policies, tenant), tenant) for tenant in demand}

    def _weight(self, policy: TenantPolicy, tenant: str) -> float:
        allowance = self._allowances.get(tenant)
        if policy.burst is not None and allowance is not None and allowance.busy and allowance.left > 0:
            return policy.burst.weight
        return policy.weight

    def left(self, tenant: str) -> float | None:
        """Seconds of burst the tenant had left at the last reading (None: no burst)."""
        a = self._allowances.get(tenant)
        return None if a is None else a.left
