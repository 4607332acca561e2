"""The judge fleet of one process: which endpoint takes each call, and when.

Calls wait here, not in the judge servers: an endpoint is sent at most this process's
share of its learned limit (:mod:`~drcredit.judges.fleet.limits`, shared through
:mod:`~drcredit.judges.fleet.store`), and a waiting call is handed the next free place
in order of its priority (:data:`CALL_PRIORITY`, the calls its chain still has to make:
the step's longest chains first), arrival order among equals. A call goes to the
endpoint that would answer it soonest: the least ``(in flight + 1) x its latency /
weight`` among those with room, so a slow replica gets less. Endpoints out of the
rotation (:mod:`~drcredit.judges.fleet.health`) are offered one probe call at a time;
a call whose candidates are all out fails at once with :class:`AllEndpointsDown`, which
the judge's retry loop and breaker turn into the outage wait. Calls are paced under the
endpoints' rate limits and the operator's ``DRCREDIT_JUDGE_RPM`` / ``_TPM``
(:mod:`~drcredit.judges.fleet.rates`) before they are sent.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import os
import socket
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

from drcredit.judges.fleet import limits
from drcredit.judges.fleet.endpoints import EndpointConfig
from drcredit.judges.fleet.health import EndpointHealth
from drcredit.judges.fleet.limits import LatencyWatch
from drcredit.judges.fleet.rates import (
    ACCEPTED_WINDOW_S,
    QUIET_S,
    RateHeaders,
    RateLimits,
    inferred_rpm,
    probed_rpm,
)
from drcredit.judges.fleet.store import EndpointRecord, FleetStore, MemoryStore, ProcessReport, with_facts

log = logging.getLogger("drcredit.judges.fleet")

#: The priority of the judge calls made by the current task: the calls its unit still
#: has to make (set by the scoring engine's slots; more goes first).
CALL_PRIORITY: ContextVar[int] = ContextVar("drcredit_call_priority", default=0)

#: Seconds between two reports of this process while it has calls (and when idle).
SYNC_ACTIVE_S = 0.2
SYNC_IDLE_S = 1.0
#: A 429 without retry-after keeps the endpoint cool this long.
DEFAULT_COOL_S = 1.0


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
    counts: Counter[str] = field(default_factory=Counter)
    #: When calls were sent, and those refused with a 429 (the rate the endpoint
    #: accepts), the last 429, and seconds calls waited for its pace since the last report.
    sent: deque[float] = field(default_factory=lambda: deque(maxlen=8192))
    refused: deque[float] = field(default_factory=lambda: deque(maxlen=8192))
    last_429: float = -math.inf
    paced_s: float = 0.0
    #: When the pace was last inferred from a 429.
    inferred_at: float | None = None

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def limit(self) -> float:
        return self.record.limit.limit

    @property
    def share(self) -> int:
        """Calls this process may have in flight on the endpoint."""
        return max(1, math.floor(self.limit * self.fraction + 1e-9))

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
    #: Token units reserved under a tokens-per-minute pace, refunded to the usage.
    reserved_tokens: float = 0.0
    released: bool = False


@dataclass(order=True)
class _Waiter:
    rank: tuple[int, int]
    exclude: frozenset[str] = field(compare=False)
    force_probe: bool = field(compare=False)
    future: asyncio.Future[Lease] = field(compare=False)


class Fleet:
    """The endpoints of one judge in one process, and the calls waiting for them."""

    def __init__(
        self,
        configs: Sequence[EndpointConfig],
        *,
        store: FleetStore | None = None,
        configured: RateLimits = RateLimits(),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.endpoints = [Endpoint(c) for c in configs]
        for e in self.endpoints:
            e.record = replace(e.record, limit=limits.capped(e.record.limit, self._cap(e, e.record)))
        self.by_url = {e.url: e for e in self.endpoints}
        self.store = store or MemoryStore()
        self.configured = configured
        self.process = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._clock = clock
        #: Waiting calls: plain ones by priority, and the few that may not use every
        #: endpoint (retries excluding one) or must probe.
        self._waiters: list[_Waiter] = []
        self._special: list[_Waiter] = []
        self._arrivals = itertools.count()
        self._waiting = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._sync_task: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()
        self._wake_sync = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self._last_sync = clock()
        #: Called with (endpoint, up) when an endpoint leaves or rejoins the rotation.
        self.listeners: list[Callable[[Endpoint, bool], None]] = []

    # ------------------------------------------------------------------ reading

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.endpoints]

    @property
    def demand(self) -> int:
        return self._waiting + sum(e.in_flight for e in self.endpoints)

    def overview(self) -> list[dict[str, Any]]:
        """Each endpoint as this process sees it (embedded mode's /readyz)."""
        return [self._endpoint_report(e) for e in self.endpoints]

    def _endpoint_report(self, e: Endpoint) -> dict[str, Any]:
        return {
            "in_flight": e.in_flight,
            "up": e.health.up,
            "since": e.health.since.isoformat(timespec="seconds"),
            "reason": e.health.reason,
            "outages": e.health.outages,
            "latency_s": e.latency.ewma,
            "limit": round(e.limit, 2),
            "share": e.share,
            "cooling_s": max(0.0, round(e.cool_until - self._clock(), 3)),
            "counts": dict(e.counts),
        }

    # ------------------------------------------------------------------ acquiring

    async def acquire(self, *, exclude: frozenset[str] = frozenset(), force_probe: bool = False) -> Lease:
        """A place on the best endpoint for one call (waiting in priority order).

        ``exclude``: endpoints this call already failed on in its current attempt.
        ``force_probe``: the judge's own breaker is probing: try an endpoint that is out
        of the rotation even before its probe is due.
        """
        await self._started()
        special = bool(exclude) or force_probe
        if not (self._special if special else self._waiters):
            lease = self._place(exclude, force_probe)
            if lease is not None:
                return lease
        if not self._candidates_alive(exclude, force_probe):
            raise AllEndpointsDown(self._down_reasons(exclude))
        waiter = _Waiter(
            (-CALL_PRIORITY.get(), next(self._arrivals)),
            exclude,
            force_probe,
            asyncio.get_running_loop().create_future(),
        )
        heapq.heappush(self._special if special else self._waiters, waiter)
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

    def _candidates_alive(self, exclude: frozenset[str], force_probe: bool) -> bool:
        now = self._clock()
        for e in self.endpoints:
            if e.url in exclude:
                continue
            if e.health.up or (e.health.probe_due(now) or (force_probe and not e.health.probing)):
                return True
            if not e.health.up and e.health.probing:
                return True  # a probe is under way: its verdict comes soon
        return False

    def _down_reasons(self, exclude: frozenset[str]) -> str:
        return "; ".join(
            f"{e.url}: {'failed for this call' if e.url in exclude else e.health.reason or 'out of the rotation'}"
            for e in self.endpoints
        )

    def _place(self, exclude: frozenset[str], force_probe: bool) -> Lease | None:
        """Take a place for a call now, or None when it must wait."""
        now = self._clock()
        for e in self.endpoints:
            probe = not e.health.up and not e.health.probing and (e.health.probe_due(now) or force_probe)
            if probe and e.url not in exclude:
                e.health.start_probe()
                return self._lease(e, probe=True)
        best: Endpoint | None = None
        best_cost = math.inf
        fallback = self._typical_pace()
        for e in self.endpoints:
            if e.url in exclude or not e.health.up or e.cool_until > now or e.in_flight >= e.share:
                continue
            cost = (e.in_flight + 1) * e.pace(fallback) / e.config.weight
            if cost < best_cost:
                best, best_cost = e, cost
        return None if best is None else self._lease(best, probe=False)

    def _typical_pace(self) -> float:
        known = [e.latency.ewma for e in self.endpoints if e.latency.ewma is not None]
        return sum(known) / len(known) if known else 1.0

    def _lease(self, e: Endpoint, *, probe: bool) -> Lease:
        e.in_flight += 1
        return Lease(e, e.record.limit.epoch, probe)

    def _dispatch(self) -> None:
        """Hand free places to waiting calls: retries and probes first, then the plain
        calls by priority until one finds no room (then none below would either)."""
        kept = [w for w in self._special if not self._serve(w)]
        heapq.heapify(kept)
        self._special = kept
        while self._waiters:
            waiter = self._waiters[0]
            if not self._serve(waiter):
                break
            heapq.heappop(self._waiters)
        self._arm_timer()

    def _serve(self, waiter: _Waiter) -> bool:
        """Place a waiting call, or fail it when nothing can take it; False: it waits on."""
        if waiter.future.done():
            return True
        lease = self._place(waiter.exclude, waiter.force_probe)
        if lease is not None:
            waiter.future.set_result(lease)
            return True
        if not self._candidates_alive(waiter.exclude, waiter.force_probe):
            waiter.future.set_exception(AllEndpointsDown(self._down_reasons(waiter.exclude)))
            return True
        return False

    def _arm_timer(self) -> None:
        """Wake the waiters when a cooling endpoint warms up or a probe falls due."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not (self._waiters or self._special):
            return
        now = self._clock()
        due = [e.cool_until for e in self.endpoints if e.cool_until > now]
        due += [e.health.next_probe for e in self.endpoints if not e.health.up and not e.health.probing]
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
        if lease.probe and e.health.probing:
            e.health.probe_abandoned()
        self._dispatch()

    def answered(self, lease: Lease, latency_s: float | None, rates: RateHeaders | None = None) -> None:
        """The endpoint answered (any HTTP answer but a 429 or a 5xx); ``latency_s`` of a
        completion (None: an error answer, which says nothing of the server's pace)."""
        e = lease.endpoint
        e.counts["answered"] += 1
        if e.health.answered():
            self._notify(e, True)
        if latency_s is None:
            return
        if e.latency.observe(latency_s):
            self._cut(lease, limits.LATENCY_CUT)
            e.latency.forget_recent()
        elif e.in_flight * 2 >= e.share and not e.record.limit.epoch > lease.epoch:
            # Busy (at least half its share in flight, this call included): the answer
            # says the endpoint kept pace with that load, so it may take more.
            e.grown += 1
            e.record = replace(e.record, limit=limits.grow(e.record.limit, 1))
        if rates is not None:
            self._learn_rates(e, rates)

    def rate_limited(self, lease: Lease, rates: RateHeaders) -> None:
        """A 429: the endpoint is alive but wants fewer calls. It cools for its
        retry-after; without a rate in its headers, the rate it accepted just before
        becomes its pace (once per round), or failing that its concurrency is cut."""
        e = lease.endpoint
        now = self._clock()
        e.counts["rate_limited"] += 1
        e.last_429 = now
        e.refused.append(lease.sent_at)
        if e.health.answered():
            self._notify(e, True)
        e.cool_until = max(e.cool_until, now + (rates.wait_s if rates.wait_s is not None else DEFAULT_COOL_S))
        self._learn_rates(e, rates)
        if e.record.rpm is not None and not e.record.rpm_inferred:
            return  # the endpoint declared its rate: pacing under it is the answer
        first = e.inferred_at is None or not e.record.rpm_inferred
        since = now - ACCEPTED_WINDOW_S if first or e.inferred_at is None else e.inferred_at
        rpm = inferred_rpm(e.sent, e.refused, since, now)
        if rpm is None:
            if first:
                self._cut(lease, limits.ERROR_CUT)
            return
        e.inferred_at = now
        if e.record.rpm is None or rpm < e.record.rpm:
            self._set_inferred(e, rpm)
        self._cut(lease, 1.0)  # slow start ends: the endpoint pushed back

    def failed(self, lease: Lease, outcome: str, reason: str) -> None:
        """No answer: a connection refused or cut, a timeout, a 5xx."""
        e = lease.endpoint
        e.counts[outcome] += 1
        if e.health.failed(reason, self._clock(), probe=lease.probe):
            log.warning("judge endpoint %s out of the rotation: %s", e.url, reason)
            self._notify(e, False)
        if e.health.up:
            self._cut(lease, limits.ERROR_CUT)

    def _notify(self, e: Endpoint, up: bool) -> None:
        if up:
            log.warning("judge endpoint %s back in the rotation", e.url)
        for listener in self.listeners:
            try:
                listener(e, up)
            except Exception:
                log.warning("a judge endpoint listener failed", exc_info=True)

    def _cut(self, lease: Lease, factor: float) -> None:
        e = lease.endpoint
        if e.record.limit.epoch > lease.epoch:
            return  # already cut since this call went out
        e.record = replace(e.record, limit=limits.cut(e.record.limit, lease.epoch, factor))
        e.grown = 0.0
        self._background_update(e, lambda r: replace(r, limit=limits.cut(r.limit, lease.epoch, factor)))

    def _learn_rates(self, e: Endpoint, rates: RateHeaders) -> None:
        if rates.wait_s is not None and rates.wait_s > 0:
            e.cool_until = max(e.cool_until, self._clock() + rates.wait_s)
        known = rates.limits
        if (known.rpm is not None and known.rpm != e.record.rpm) or (
            known.tpm is not None and known.tpm != e.record.tpm
        ):
            e.record = replace(
                e.record,
                rpm=known.rpm if known.rpm is not None else e.record.rpm,
                tpm=known.tpm or e.record.tpm,
                rpm_inferred=e.record.rpm_inferred and known.rpm is None,
            )
            declared = with_facts(rpm=known.rpm, tpm=known.tpm)
            self._background_update(
                e, lambda r: replace(declared(r), rpm_inferred=r.rpm_inferred and known.rpm is None)
            )

    def _set_inferred(self, e: Endpoint, rpm: float) -> None:
        e.record = replace(e.record, rpm=rpm, rpm_inferred=True)

        def change(record: EndpointRecord) -> EndpointRecord:
            if record.rpm is not None and not record.rpm_inferred:
                return record
            return replace(record, rpm=rpm, rpm_inferred=True)

        self._background_update(e, change)

    def learn(self, url: str, *, context_tokens: int | None = None, slots: int | None = None) -> None:
        """What an endpoint says of itself (its context window, its parallel slots)."""
        e = self.by_url[url]
        e.record = replace(
            e.record,
            context_tokens=context_tokens or e.record.context_tokens,
            slots=slots or e.record.slots,
        )
        e.record = replace(e.record, limit=limits.capped(e.record.limit, self._cap(e, e.record)))
        self._background_update(e, with_facts(context_tokens=context_tokens, slots=slots))

    def _background_update(self, e: Endpoint, change: Callable[[EndpointRecord], EndpointRecord]) -> None:
        async def run() -> None:
            try:
                record = await self.store.update(e.url, change)
            except Exception:
                log.warning("could not share what was learned of %s", e.url, exc_info=True)
                return
            self._adopt(e, record)
            self._dispatch()

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ pacing

    async def pace(self, lease: Lease, tokens: float) -> None:
        """Wait for the call's turn under every rate limit that applies to it."""
        e = lease.endpoint
        schedules: list[tuple[str, float, float]] = []
        if self.configured.rpm:
            schedules.append((f"fleet:{self.store_scope}:rpm", 1.0, self.configured.rpm / 60))
        if self.configured.tpm:
            schedules.append((f"fleet:{self.store_scope}:tpm", tokens, self.configured.tpm / 60))
        if e.record.rpm:
            schedules.append((f"{e.url}:rpm", 1.0, e.record.rpm / 60))
        if e.record.tpm:
            schedules.append((f"{e.url}:tpm", tokens, e.record.tpm / 60))
        wait = 0.0
        for key, cost, rate in schedules:
            wait = max(wait, await self.store.reserve(key, cost, rate))
            if key.endswith(":tpm"):
                lease.reserved_tokens = tokens
        if wait > 0:
            e.paced_s += wait
            await asyncio.sleep(wait)
        lease.sent_at = self._clock()
        e.sent.append(lease.sent_at)

    async def settle_tokens(self, lease: Lease, used: float) -> None:
        """Give back what a call reserved under a tokens-per-minute pace beyond its usage."""
        unused = lease.reserved_tokens - used
        if unused <= 0:
            return
        e = lease.endpoint
        if self.configured.tpm:
            await self.store.refund(f"fleet:{self.store_scope}:tpm", unused, self.configured.tpm / 60)
        if e.record.tpm:
            await self.store.refund(f"{e.url}:tpm", unused, e.record.tpm / 60)

    @property
    def store_scope(self) -> str:
        return getattr(self.store, "scope", "local")

    # ------------------------------------------------------------------ sharing

    async def _started(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # A new event loop (the engine's, or a synchronous call's short-lived one):
            # what was bound to the old one cannot be awaited here.
            self._loop = loop
            self._sync_task, self._timer = None, None
            self._synced, self._wake_sync = asyncio.Event(), asyncio.Event()
            self._waiters, self._special = [], []
        if self._sync_task is None or self._sync_task.done():
            self._sync_task = asyncio.get_running_loop().create_task(self._sync_loop())
        if not self._synced.is_set():
            await self._synced.wait()

    async def _sync_loop(self) -> None:
        while True:
            try:
                await self.sync()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("could not share the judge fleet's state; retrying", exc_info=True)
            finally:
                self._synced.set()
            self._wake_sync.clear()
            interval = SYNC_ACTIVE_S if self.demand else SYNC_IDLE_S
            try:
                await asyncio.wait_for(self._wake_sync.wait(), interval)
            except TimeoutError:
                pass
            if self._wake_sync.is_set():
                await asyncio.sleep(0.02)  # gather a burst of arrivals into one report

    async def sync(self) -> None:
        """Publish this process's demand and learning; adopt the fleet's records and share."""
        now = self._clock()
        elapsed, self._last_sync = now - self._last_sync, now
        for e in self.endpoints:
            grown, e.grown = e.grown, 0.0
            if grown:
                self._adopt(e, await self.store.update(e.url, _growth(grown)))
            paced, e.paced_s = e.paced_s, 0.0
            if e.record.rpm_inferred and paced > 0 and now - e.last_429 > QUIET_S:
                self._adopt(e, await self.store.update(e.url, _probe_rate(min(elapsed, 1.0))))
        report = ProcessReport(
            self.process, time.time(), self.demand, {e.url: self._endpoint_report(e) for e in self.endpoints}
        )
        records, fraction = await self.store.sync(report, self.urls)
        for e in self.endpoints:
            e.fraction = fraction
            self._adopt(e, records[e.url])
        self._dispatch()

    def _adopt(self, e: Endpoint, record: EndpointRecord) -> None:
        """Take the fleet's record, keeping the growth of this process not shared yet."""
        limit = limits.capped(record.limit, self._cap(e, record))
        if e.grown:
            limit = limits.grow(limit, e.grown)
        e.record = replace(record, limit=limit)

    @staticmethod
    def _cap(e: Endpoint, record: EndpointRecord) -> float | None:
        caps = [c for c in (e.config.max_concurrency, record.slots) if c]
        return float(min(caps)) if caps else None

    async def aclose(self) -> None:
        if self._sync_task is not None:
            self._sync_task.cancel()
            try:
                await self._sync_task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - closing
                pass
            self._sync_task = None
            self._synced = asyncio.Event()
        await self.store.aclose()


def _growth(answers: float) -> Callable[[EndpointRecord], EndpointRecord]:
    return lambda r: replace(r, limit=limits.grow(r.limit, answers))


def _probe_rate(seconds: float) -> Callable[[EndpointRecord], EndpointRecord]:
    def change(record: EndpointRecord) -> EndpointRecord:
        if not record.rpm_inferred or record.rpm is None:
            return record
        return replace(record, rpm=probed_rpm(record.rpm, seconds))

    return change
