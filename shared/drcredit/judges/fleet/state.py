"""What one process knows of each endpoint of its judge fleet, and of each call placed.

Shared by the fleet's parts (:mod:`~drcredit.judges.fleet.router`,
:mod:`~drcredit.judges.fleet.learning`, :mod:`~drcredit.judges.fleet.sharing`); only
touched from the process's engine loop.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, deque
from contextvars import ContextVar
from dataclasses import dataclass, field

from drcredit.judges.fleet.endpoints import EndpointConfig
from drcredit.judges.fleet.health import EndpointHealth
from drcredit.judges.fleet.latency import LatencyWatch
from drcredit.judges.fleet.prefill import PrefillQueue
from drcredit.judges.fleet.store import EndpointRecord
from drcredit.tenancy.owner import Owner

#: The priority of the judge calls made by the current task: the calls its unit still
#: has to make (set by the scoring engine's slots; more goes first).
CALL_PRIORITY: ContextVar[int] = ContextVar("drcredit_call_priority", default=0)


class AllEndpointsDown(Exception):
    """Every endpoint this call may use is out of the rotation."""


@dataclass
class Endpoint:
    """One endpoint as this process sees it (engine loop only)."""

    config: EndpointConfig
    record: EndpointRecord = field(default_factory=EndpointRecord)
    #: This process's part of the fleet-wide limit (a fraction of the demand).
    fraction: float = 1.0
    in_flight: int = 0
    health: EndpointHealth = field(default_factory=EndpointHealth)
    latency: LatencyWatch = field(default_factory=LatencyWatch)
    cool_until: float = 0.0
    #: Answers at normal latency while busy, not yet added to the shared limit.
    grown: float = 0.0
    #: The most calls it had in flight when one was answered (what it has shown it takes),
    #: and the slow-start schedule of the calls sent beyond that (see ``Sharing.pace``).
    proven: int = 0
    growth_tat: float = 0.0
    #: The limit when the endpoint last answered: what an outage's cuts fell from.
    answered_limit: float | None = None
    counts: Counter[str] = field(default_factory=Counter)
    #: When the server is done with the calls that timed out in its queue (their work
    #: goes on, answered to nobody), at ``unread_spacing`` seconds each (one service time
    #: over its slots): until then they hold places as if in flight.
    unread_until: float = -math.inf
    unread_spacing: float = 0.0
    #: When calls were sent, and those refused with a 429 (the rate the endpoint
    #: accepts), the last 429, and seconds calls waited for its pace since the last report.
    sent: deque[float] = field(default_factory=lambda: deque(maxlen=8192))
    refused: deque[float] = field(default_factory=lambda: deque(maxlen=8192))
    last_429: float = -math.inf
    paced_s: float = 0.0
    #: When the pace was last inferred from a 429, and last cut by a 429 too soon after.
    inferred_at: float | None = None
    rate_cut_at: float = -math.inf
    #: Its calls waiting for their prefill, and how many may.
    prefill: PrefillQueue = field(default_factory=PrefillQueue)

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def limit(self) -> float:
        return self.record.limit.limit

    @property
    def load(self) -> float:
        """Calls in flight at the endpoint fleet-wide, estimated from this process's part."""
        return self.in_flight / max(self.fraction, 1e-3)

    def unread(self, now: float) -> int:
        """Calls that timed out still in the server's queue (by the estimate), at ``now``."""
        if now >= self.unread_until or self.unread_spacing <= 0:
            return 0
        return math.ceil((self.unread_until - now) / self.unread_spacing)

    @property
    def share(self) -> int:
        """Calls this process may have in flight on the endpoint."""
        return max(1, math.floor(self.limit * self.fraction + 1e-9))

    def cap(self, record: EndpointRecord) -> float | None:
        """The most calls it may be sent at once: the operator's max_concurrency, or
        the slots the server reports, whichever is lower (None: only what is learned)."""
        caps = [c for c in (self.config.max_concurrency, record.slots) if c]
        return float(min(caps)) if caps else None

    def pace(self, fallback: float) -> float:
        return self.latency.ewma if self.latency.ewma is not None else fallback


@dataclass
class Lease:
    """A place on an endpoint for one call: released exactly once."""

    endpoint: Endpoint
    epoch: int
    probe: bool
    #: When the call went out (after its pacing).
    sent_at: float = 0.0
    #: Calls in flight at the endpoint, fleet-wide (estimated), when it went out.
    load: float = 1.0
    #: Token units reserved under a tokens-per-minute pace, refunded to the usage.
    reserved_tokens: float = 0.0
    released: bool = False
    #: The tenant whose call holds the place (its in-flight count in the process).
    tenant: str = ""
    #: Its first streamed event has not come yet.
    prefilling: bool = False
    #: A call with its prompt head (affinity key) went to the endpoint before it.
    follows: bool = False


@dataclass(order=True)
class Waiter:
    rank: tuple[int, int]
    exclude: frozenset[str] = field(compare=False)
    force_probe: bool = field(compare=False)
    future: asyncio.Future[Lease] = field(compare=False)
    owner: Owner = field(compare=False, default=Owner())
