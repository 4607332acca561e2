"""The judge fleet of one process: which endpoint takes each call, and when.

Calls wait here, not in the judge servers: an endpoint is sent at most this process's
share of its learned limit (:mod:`~drcredit.judges.fleet.limits`, shared through
:mod:`~drcredit.judges.fleet.store`) and, where it streams, at most its depth of calls
waiting for their prefill (:mod:`~drcredit.judges.fleet.prefill`), and a waiting call is handed the next free place
in order of its priority (:data:`CALL_PRIORITY`, the calls its chain still has to make:
the step's longest chains first), arrival order among equals. A call goes to the
endpoint that would answer it soonest: the least ``latency x (1 + load / share) /
weight``, where the load of a full endpoint counts the calls ahead of this one; a call
waits when that endpoint is full, so a slow replica gets only the calls that would wait
longer for a fast one (the least urgent). Endpoints out of the rotation
(:mod:`~drcredit.judges.fleet.health`) are probed by a health check in the background
and rejoin when it is answered; a call whose candidates are all out fails at once with
:class:`AllEndpointsDown`, which the judge's retry loop and breaker turn into the outage
wait (whose own probe call may go to an endpoint out of the rotation). Calls are paced
under the endpoints' rate limits and the operator's ``DRCREDIT_JUDGE_RPM`` / ``_TPM``
(:mod:`~drcredit.judges.fleet.rates`) before they are sent.

Whose call goes first among those waiting is the tenants' fair share
(:mod:`drcredit.tenancy.fair`: tenants by weight, training before audits, runs in
turn, then the priority above), asked of :class:`~drcredit.tenancy.shares.Shares`,
which also sets this process's part of each endpoint's limit at every report.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from drcredit import metrics
from drcredit.judges.fleet import limits
from drcredit.judges.fleet.affinity import CALL_AFFINITY, LOAD_BOUND, Affinities, Pins, steer
from drcredit.judges.fleet.endpoints import EndpointConfig
from drcredit.judges.fleet.learning import Learning
from drcredit.judges.fleet.rates import RateLimits
from drcredit.judges.fleet.sharing import Sharing
from drcredit.judges.fleet.state import CALL_PRIORITY, AllEndpointsDown, Endpoint, Lease, Waiter
from drcredit.judges.fleet.store import FleetStore, MemoryStore
from drcredit.tenancy.fair import FairQueue
from drcredit.tenancy.owner import CALL_OWNER
from drcredit.tenancy.shares import Shares

__all__ = ["CALL_PRIORITY", "AllEndpointsDown", "Endpoint", "Fleet", "Lease"]


class Fleet(Learning, Sharing):
    """The endpoints of one judge in one process, and the calls waiting for them."""

    def __init__(
        self,
        configs: Sequence[EndpointConfig],
        *,
        store: FleetStore | None = None,
        configured: RateLimits = RateLimits(),
        clock: Callable[[], float] = time.monotonic,
        prober: Callable[[EndpointConfig], Awaitable[str | None]] | None = None,
        shares: Shares | None = None,
    ):
        self.endpoints = [Endpoint(c) for c in configs]
        for e in self.endpoints:
            e.record = replace(e.record, limit=limits.capped(e.record.limit, e.cap(e.record)))
        self.by_url = {e.url: e for e in self.endpoints}
        self.store = store or MemoryStore()
        self.shares = shares or Shares()
        self.store.divide = self._divide
        self.configured = configured
        self.process = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._clock = clock
        #: Waiting calls: plain ones in the tenants' fair order, and the few that may not
        #: use every endpoint (retries excluding one) or must probe.
        self._waiters: FairQueue[Waiter] = FairQueue(self.shares.weight)
        self._special: list[Waiter] = []
        #: Calls in flight per tenant (the cap of a tenant with ``max_share``).
        self._tenant_in_flight: Counter[str] = Counter()
        self._tenants_waiting: set[str] = set()
        self._arrivals = itertools.count()
        self._waiting = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._sync_task: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()
        self._wake_sync = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        #: Health checks in flight (closing the fleet cancels them).
        self._probes: set[asyncio.Task[None]] = set()
        self._last_sync = clock()
        #: Called with (endpoint, up) when an endpoint leaves or rejoins the rotation.
        self.listeners: list[Callable[[Endpoint, bool], None]] = []
        self.prober = prober
        #: The affinity keys of waiting calls (calls sharing a prompt prefix, one replica).
        self.affinities = Affinities()
        #: The replica each affinity key's calls go to (its first call's).
        self.pins = Pins()

    @property
    def demand(self) -> int:
        return self._waiting + sum(e.in_flight for e in self.endpoints)

    def _reset_waiters(self) -> None:
        self._waiters, self._special = FairQueue(self.shares.weight), []

    def tenant_demand(self) -> dict[str, int]:
        """Calls waiting or in flight per tenant."""
        demand = Counter(self._waiters.waiting())
        demand.update(w.owner.tenant for w in self._special if not w.future.done())
        demand.update(self._tenant_in_flight)
        return {t: n for t, n in demand.items() if n > 0}

    # ------------------------------------------------------------------ acquiring

    async def acquire(self, *, exclude: frozenset[str] = frozenset(), force_probe: bool = False) -> Lease:
        """A place on the best endpoint for one call (waiting in priority order).

        ``exclude``: endpoints this call already failed on in its current attempt.
        ``force_probe``: the judge's own breaker is probing: try an endpoint that is out
        of the rotation even before its probe is due.
        """
        await self._started()
        special = bool(exclude) or force_probe
        key = CALL_AFFINITY.get()
        owner = CALL_OWNER.get()
        if not (self._special if special else self._waiters) and (
            special or owner.tenant not in self.shares.capped(self._tenant_in_flight)
        ):
            lease = self._place(exclude, force_probe, key=key)
            if lease is not None:
                return self._owned(lease, owner.tenant)
        if not self._candidates_alive(exclude, force_probe):
            raise AllEndpointsDown(self._down_reasons(exclude))
        priority = CALL_PRIORITY.get()
        waiter = Waiter(
            (-priority, next(self._arrivals)),
            exclude,
            force_probe,
            asyncio.get_running_loop().create_future(),
            owner,
        )
        if special:
            heapq.heappush(self._special, waiter)
        else:
            self._waiters.push(waiter, owner, priority)
        self.affinities.remember(waiter.rank, key)
        self._waiting += 1
        self._wake_sync.set()
        self._dispatch()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            future = waiter.future
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result())  # placed just as it was cancelled: pass it on
            raise
        finally:
            self._waiting -= 1
            self.affinities.forget(waiter.rank)

    def takes_calls(self, *, exclude: frozenset[str] = frozenset()) -> bool:
        """Whether an endpoint outside ``exclude`` is in the rotation."""
        return self._candidates_alive(exclude, False)

    def _candidates_alive(self, exclude: frozenset[str], force_probe: bool) -> bool:
        return any(e.url not in exclude and (e.health.up or force_probe) for e in self.endpoints)

    def _down_reasons(self, exclude: frozenset[str]) -> str:
        return "; ".join(
            f"{e.url}: {'failed for this call' if e.url in exclude else e.health.reason or 'out of the rotation'}"
            for e in self.endpoints
        )

    def _place(
        self, exclude: frozenset[str], force_probe: bool, ahead: int = 0, key: str | None = None
    ) -> Lease | None:
        """Take a place for a call now, or None when it should wait.

        ``ahead``: plain calls placed before this one. Each endpoint is scored by when it
        would answer, :meth:`_expected`; a call waits when the best is full, so a slow
        replica takes a call only once waiting for the fast one would take longer.
        """
        if force_probe:
            for e in self.endpoints:
                if e.url not in exclude and not e.health.up and not e.health.probing:
                    e.health.start_probe()
                    return self._lease(e, probe=True)
        best = self._choose(exclude, ahead, key)
        return None if best is None else self._lease(best, probe=False, key=key)

    def _choose(self, exclude: frozenset[str], ahead: int, key: str | None = None) -> Endpoint | None:
        """The endpoint with room a call should take now; None: it should wait. A call
        with an affinity ``key`` is steered to its prefix's replica within bounds
        (:func:`~drcredit.judges.fleet.affinity.steer`).

        An endpoint whose prefill queue is full (:mod:`~drcredit.judges.fleet.prefill`)
        frees a place there within moments, when one of its calls is prefilled. So when
        it is the one that would answer soonest, another takes the call only if that
        one would answer about as soon (within ``LOAD_BOUND``: an equal replica), and
        otherwise the call waits for it. Skipped outright, a replica three times slower
        took 13-18% of a step's calls, each of them a slow hop on its chain, and the step
        read 1.56x its bound (BENCHMARKS.md, round 31)."""
        now = self._clock()
        best: Endpoint | None = None
        best_time = math.inf
        # The soonest among those whose prefill queue has room.
        open_best: Endpoint | None = None
        open_time = math.inf
        fallback = self._typical_pace()
        scored: list[tuple[Endpoint, float]] = []
        for e in self.endpoints:
            if e.url in exclude or not e.health.up or e.cool_until > now:
                continue
            expected = self._expected(e, ahead, fallback)
            ewma = e.latency.ewma
            scored.append((e, math.inf if ewma is None else ewma / e.config.weight))
            if expected < best_time:
                best, best_time = e, expected
            # Asked of every candidate, as before: a full queue marks its depth as used,
            # which the depth's growth reads (prefill.PrefillQueue.full).
            room = not e.prefill.full()
            if room and expected < open_time:
                open_best, open_time = e, expected
        if best is not open_best:  # the soonest is full of calls waiting for their prefill
            best = open_best if open_best is not None and open_time <= LOAD_BOUND * best_time else None
        # Calls that timed out in its queue still take places there until it is done with them.
        if best is None or best.in_flight + best.unread(now) >= best.share:
            return None
        return steer(key, scored, best, self.pins, exclude)

    @staticmethod
    def _expected(e: Endpoint, ahead: int, fallback: float) -> float:
        """Roughly when ``e`` would answer a call with ``ahead`` calls placed before it:
        ``latency x (1 + load / share) / weight``, the load being its
        calls in flight plus, when it is full, those ahead (they take its next places).
        The load term spreads calls over equal replicas and moves them off a busy one
        before its latency shows it."""
        load = e.in_flight + (ahead if e.in_flight >= e.share else 0)
        return e.pace(fallback) * (1.0 + load / e.share) / e.config.weight

    def _typical_pace(self) -> float:
        known = [e.latency.ewma for e in self.endpoints if e.latency.ewma is not None]
        return sum(known) / len(known) if known else 1.0

    def _lease(self, e: Endpoint, *, probe: bool, key: str | None = None) -> Lease:
        e.in_flight += 1
        follows = e.prefill.sent(key)
        return Lease(e, e.record.limit.epoch, probe, load=e.load, prefilling=True, follows=follows)

    def first_event(self, lease: Lease, seconds: float) -> None:
        """The call's first streamed event came ``seconds`` after it was sent: the server
        has prefilled its prompt (:mod:`~drcredit.judges.fleet.prefill`)."""
        if lease.prefilling:  # not yet told, and not released (that clears it)
            lease.prefilling = False
            e = lease.endpoint
            e.prefill.first_event(seconds, lease.follows, lease.sent_at, self._clock(), e.latency.ewma)
            self._dispatch()

    def _owned(self, lease: Lease, tenant: str) -> Lease:
        lease.tenant = tenant
        self._tenant_in_flight[tenant] += 1
        return lease

    def _dispatch(self) -> None:
        """Hand free places to waiting calls: retries and probes first, then the plain
        calls by priority. When the most urgent call waits for a full endpoint, a place
        left on a slower one goes to the least urgent call that would be answered sooner
        there than by waiting."""
        kept = [w for w in self._special if not self._serve(w)]
        heapq.heapify(kept)
        self._special = kept
        while True:
            capped = self.shares.capped(self._tenant_in_flight)
            waiter = self._waiters.first(capped)
            if waiter is None:
                break
            if waiter.future.done():  # given up while it waited: takes nobody's turn
                self._waiters.pop_first(capped, charge=False)
                continue
            if not self._serve(waiter):
                break
            self._waiters.pop_first(capped)
        while len(self._waiters) > 1 and self._serve_last():
            pass
        while self._waiters and self._serve_fitting():
            pass
        self._export_waiting()
        self._arm_timer()

    def _export_waiting(self) -> None:
        metrics.JUDGE_CALLS_WAITING.set(len(self._waiters) + len(self._special))
        waiting = self._waiters.waiting()
        for tenant in self._tenants_waiting - waiting.keys():
            metrics.TENANT_CALLS_WAITING.labels(tenant).set(0)
        for tenant, n in waiting.items():
            metrics.TENANT_CALLS_WAITING.labels(tenant).set(n)
        self._tenants_waiting = set(waiting)

    def _serve_last(self) -> bool:
        """Place the least urgent plain call if an endpoint with room would answer it
        before its turn on the endpoint the others wait for (and its prefix is not
        pinned to a full replica it should wait for)."""
        ahead = len(self._waiters) - 1
        endpoint = self._choose(frozenset(), ahead=ahead)
        if endpoint is None:  # the common case, settled without looking at the waiters
            return False
        capped = self.shares.capped(self._tenant_in_flight)
        last = self._waiters.last(capped)
        key = None if last is None else self.affinities.of(last.rank)
        if key is not None:
            endpoint = self._choose(frozenset(), ahead=ahead, key=key)
            if endpoint is None:
                return False
        waiter = self._waiters.pop_last(capped)
        if waiter is None:
            return False
        if not waiter.future.done():
            lease = self._lease(endpoint, probe=False, key=key)
            waiter.future.set_result(self._owned(lease, waiter.owner.tenant))
        return True

    def _serve_fitting(self) -> bool:
        """Place the most urgent waiting call that an endpoint takes now: the first ones
        may wait for a replica that holds their prefix while another has room."""
        if not any(e.health.up and e.in_flight < e.share and not e.prefill.full() for e in self.endpoints):
            return False
        capped = self.shares.capped(self._tenant_in_flight)
        placed: list[Lease] = []

        def fits(waiter: Waiter) -> bool:
            if waiter.future.done():
                return False
            lease = self._place(waiter.exclude, waiter.force_probe, key=self.affinities.of(waiter.rank))
            if lease is None:
                return False
            placed.append(lease)
            return True

        waiter = self._waiters.pop_first_where(fits, capped)
        if waiter is None:
            return False
        waiter.future.set_result(self._owned(placed[0], waiter.owner.tenant))
        return True

    def _serve(self, waiter: Waiter) -> bool:
        """Place a waiting call, or fail it when nothing can take it; False: it waits on."""
        if waiter.future.done():
            return True
        lease = self._place(waiter.exclude, waiter.force_probe, key=self.affinities.of(waiter.rank))
        if lease is not None:
            waiter.future.set_result(self._owned(lease, waiter.owner.tenant))
            return True
        if not self._candidates_alive(waiter.exclude, waiter.force_probe):
            waiter.future.set_exception(AllEndpointsDown(self._down_reasons(waiter.exclude)))
            return True
        return False

    def _arm_timer(self) -> None:
        """Wake the waiters when a cooling endpoint warms up, or one is done with the calls
        that timed out in its queue."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not (self._waiters or self._special):
            return
        now = self._clock()
        due = [t for e in self.endpoints for t in (e.cool_until, e.unread_until) if t > now]
        if due:
            delay = max(0.0, min(due) - now) + 0.001
            self._timer = asyncio.get_running_loop().call_later(delay, self._dispatch)

    # ------------------------------------------------------------------ outcomes

    def release(self, lease: Lease) -> None:
        if lease.released:
            return
        lease.released = True
        e = lease.endpoint
        e.in_flight -= 1
        if lease.prefilling:
            lease.prefilling = False
            e.prefill.gone()
        self._tenant_in_flight[lease.tenant] -= 1
        if self._tenant_in_flight[lease.tenant] <= 0:
            del self._tenant_in_flight[lease.tenant]
        if not lease.probe:
            self.shares.served(lease.tenant)
        if lease.probe and e.health.probing:
            e.health.probe_abandoned()
        self._dispatch()
