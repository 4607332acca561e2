"""What the judge fleet asks of the tenants: each one's part of this process's places.

One :class:`Shares` per fleet. At every report the fleet hands it the demand per tenant
(this process's and the whole deployment's) and the fleet's capacity; it answers the
fraction of every endpoint's limit this process may use and keeps each tenant's part,
which orders the process's waiting calls (:class:`~drcredit.tenancy.fair.FairQueue`)
and caps a tenant with ``max_share``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping

from drcredit.tenancy.burst import Bursts
from drcredit.tenancy.fair import ProcessParts, process_parts
from drcredit.tenancy.policy import TenantPolicy, policy_of

#: The window of the served-calls count each process reports (``share_last_minute``).
SERVED_WINDOW_S = 60.0


class Shares:
    """The tenants' parts of one process's places on a judge fleet (engine loop only)."""

    def __init__(self, policies: Mapping[str, TenantPolicy] | None = None, clock: Callable[[], float] = time.monotonic):
        self.policies = dict(policies or {})
        self.parts: ProcessParts | None = None
        self._clock = clock
        self._served: deque[tuple[float, str]] = deque()
        self.bursts = Bursts()
        #: Each tenant's weight at the last report (its burst weight while that lasts).
        self.weights: dict[str, float] = {}

    def policy(self, tenant: str) -> TenantPolicy:
        return policy_of(self.policies, tenant)

    def divide(self, own: Mapping[str, int], fleet: Mapping[str, int], capacity: float, processes: int) -> float:
        """This process's fraction of every endpoint's limit; keeps the tenants' parts."""
        demand = {t: float(n) for t, n in fleet.items()}
        self.weights = self.bursts.weights(self.policies, demand, self._clock())
        self.parts = process_parts(
            {t: float(own.get(t, 0)) for t in demand},
            demand,
            self.weights,
            {t: self.policy(t).max_share for t in demand},
            capacity,
            processes,
        )
        return self.parts.fraction

    def weight(self, tenant: str) -> float:
        """A tenant's weight among this process's waiting calls: its part here once the
        fleet has reported its demand, else its weight on the same scale."""
        parts = self.parts.tenants if self.parts is not None else {}
        if tenant in parts and parts[tenant] > 0:
            return parts[tenant]
        known = [(v, self._weight(t)) for t, v in parts.items() if v > 0]
        scale = sum(v for v, _ in known) / sum(w for _, w in known) if known else 1.0
        return self._weight(tenant) * scale

    def _weight(self, tenant: str) -> float:
        if tenant in self.weights:
            return self.weights[tenant]
        # Arrived since the last report: a burst it has allowance for applies at once.
        policy = self.policy(tenant)
        left = self.bursts.left(tenant)
        if policy.burst is not None and (left is None or left > 0):
            return policy.burst.weight
        return policy.weight

    def capped(self, in_flight: Mapping[str, int]) -> frozenset[str]:
        """Tenants at their ``max_share`` cap in this process: none of their calls may start."""
        policies_capped = {t for t in in_flight if self.policy(t).max_share < 1}
        if not policies_capped:
            return frozenset()
        caps = self.parts.caps if self.parts is not None else {}
        return frozenset(t for t in policies_capped if t in caps and in_flight[t] >= math.floor(caps[t] + 1e-9))

    def served(self, tenant: str) -> None:
        """A call of ``tenant`` was answered here."""
        self._served.append((self._clock(), tenant))

    def served_last_minute(self) -> dict[str, int]:
        """Calls answered here per tenant over the last :data:`SERVED_WINDOW_S`."""
        horizon = self._clock() - SERVED_WINDOW_S
        while self._served and self._served[0][0] < horizon:
            self._served.popleft()
        out: dict[str, int] = {}
        for _, tenant in self._served:
            out[tenant] = out.get(tenant, 0) + 1
        return out
