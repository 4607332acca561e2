"""What the fleet shares between processes, and how calls are paced under rate limits.

A few times a second each process publishes its demand and its view of each endpoint
and adopts the fleet's records and its share of each limit
(:mod:`~drcredit.judges.fleet.store`); the same reports make ``/readyz`` and the
metrics. Calls under a rate limit reserve their turn on a schedule every process
shares (:mod:`~drcredit.judges.fleet.rates`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from drcredit import metrics
from drcredit.judges.fleet import limits
from drcredit.judges.fleet.endpoints import EndpointConfig
from drcredit.judges.fleet.rates import QUIET_S, RateLimits, probed_rpm, reserve
from drcredit.judges.fleet.report import endpoint_status
from drcredit.judges.fleet.state import Endpoint, Lease
from drcredit.judges.fleet.store import STALE_S, EndpointRecord, FleetStore, ProcessReport, demand_share
from drcredit.tenancy.shares import Shares

log = logging.getLogger("drcredit.judges.fleet")

#: Seconds between two reports of this process while it has calls (and when idle).
SYNC_ACTIVE_S = 0.2
SYNC_IDLE_S = 1.0


class Sharing:
    """The fleet's reports, shared records and paced schedules (a part of
    :class:`~drcredit.judges.fleet.router.Fleet`)."""

    endpoints: list[Endpoint]
    store: FleetStore
    configured: RateLimits
    process: str
    _clock: Callable[[], float]
    _loop: asyncio.AbstractEventLoop | None
    _timer: asyncio.TimerHandle | None
    _sync_task: asyncio.Task[None] | None
    _synced: asyncio.Event
    _wake_sync: asyncio.Event
    _last_sync: float
    _background: set[asyncio.Task[Any]]
    _probes: set[asyncio.Task[None]]
    _waiting: int
    #: Health check of an endpoint out of the rotation: None when it answered, else why not.
    prober: Callable[[EndpointConfig], Awaitable[str | None]] | None
    shares: Shares

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.endpoints]

    if TYPE_CHECKING:  # provided by the Fleet and its other parts

        @property
        def demand(self) -> int: ...

        def _dispatch(self) -> None: ...

        def _reset_waiters(self) -> None: ...

        def tenant_demand(self) -> dict[str, int]: ...

        def _notify(self, e: Endpoint, up: bool) -> None: ...

    # ------------------------------------------------------------------ reading

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
            # Calls this process holds back for a place on its endpoints (the same for each).
            "waiting": self._waiting,
            "cooling_s": max(0.0, round(e.cool_until - self._clock(), 3)),
            "counts": dict(e.counts),
            # Calls waiting for their prefill, and how many may (None: it does not stream).
            "prefilling": e.prefill.waiting,
            "prefill_depth": round(e.prefill.depth, 2) if e.prefill.gates else None,
        }

    # ------------------------------------------------------------------ pacing

    async def pace(self, lease: Lease, tokens: float) -> None:
        """Wait for the call's turn under every rate limit that applies to it.

        A call whose turn came while its endpoint cooled after a 429 waits out the
        cooling and goes: the quota refilled while nothing was sent, so the turns that
        fell in the cooling are spent when it ends (taking new turns wasted the cooling's
        share of the schedule a second time, the quota idle for a second more per 429).
        A call whose pace was lowered meanwhile takes a turn on the new schedule.
        """
        e = lease.endpoint
        growth = None if e.record.rpm is not None else self._growth_wait(e)
        if growth:
            await asyncio.sleep(growth)
        while True:
            pace = e.record.rpm
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
                try:
                    wait = max(wait, await self.store.reserve(key, cost, rate))
                except RedisError as exc:
                    # The shared schedule is out of reach: the call goes unpaced rather than
                    # failing; a 429 it may draw is an answer the fleet handles.
                    log.warning("could not pace a judge call on the shared schedule %s: %s", key, exc)
                    continue
                if key.endswith(":tpm"):
                    lease.reserved_tokens = tokens
            if wait > 0:
                e.paced_s += wait
                await asyncio.sleep(wait)
            cooling = e.cool_until - self._clock()
            while cooling > 0:
                await asyncio.sleep(cooling)
                cooling = e.cool_until - self._clock()
            if pace is not None and e.record.rpm is not None and e.record.rpm < pace:
                continue
            break
        lease.sent_at = self._clock()
        lease.load = e.load
        e.sent.append(lease.sent_at)

    async def refused(self, lease: Lease) -> None:
        """A 429 under the endpoint's pace: its quota is empty now, so the schedule was
        ahead of it (a first step's schedule starts with a burst's credit the quota has
        already spent). The next call starts no sooner than one turn from now; a turn,
        not the retry-after, which servers round up to whole seconds."""
        e = lease.endpoint
        if e.record.rpm is None:
            return
        try:
            await self.store.defer(f"{e.url}:rpm", 60.0 / e.record.rpm)
        except RedisError as exc:
            log.warning("could not hold back the shared schedule of %s after a 429: %s", e.url, exc)

    def _growth_wait(self, e: Endpoint) -> float:
        """Slow start's new room on an endpoint with no known rate, spread over half a
        round (:func:`limits.growth_pace`); seconds this call waits."""
        proven = max(e.proven, limits.INITIAL_LIMIT * e.fraction)
        rate = limits.growth_pace(e.record.limit, e.in_flight, proven, e.share, e.pace(1.0))
        if rate is None:
            return 0.0
        e.growth_tat, wait = reserve(e.growth_tat, self._clock(), 1.0, rate)
        return wait

    async def settle_tokens(self, lease: Lease, used: float) -> None:
        """Give back what a call reserved under a tokens-per-minute pace beyond its usage."""
        unused = lease.reserved_tokens - used
        if unused <= 0:
            return
        e = lease.endpoint
        try:
            if self.configured.tpm:
                await self.store.refund(f"fleet:{self.store_scope}:tpm", unused, self.configured.tpm / 60)
            if e.record.tpm:
                await self.store.refund(f"{e.url}:tpm", unused, e.record.tpm / 60)
        except RedisError as exc:  # the schedule keeps the estimate: later calls wait a little longer
            log.warning("could not give back %.0f unused tokens to the shared schedule: %s", unused, exc)

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
            self._reset_waiters()
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

    def _probe_due_endpoints(self) -> None:
        """Health-check each endpoint out of the rotation whose probe is due (any HTTP
        answer brings it back), in the background."""
        if self.prober is None:
            return
        now = self._clock()
        for e in self.endpoints:
            if e.health.probe_due(now):
                e.health.start_probe()
                self._check(e)

    def _check(self, e: Endpoint) -> None:
        """Health-check ``e`` in the background (its health has marked the check started)."""
        if self.prober is None:
            self._checked(e, e.health.reason or "failing, and no health check to tell")
            return
        task = asyncio.get_running_loop().create_task(self._probe(e))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _probe(self, e: Endpoint) -> None:
        assert self.prober is not None
        try:
            problem = await self.prober(e.config)
        except Exception as exc:  # noqa: BLE001 - a probe that errs is a probe that failed
            problem = f"{type(exc).__name__}: {exc}"
        self._checked(e, problem)

    def _checked(self, e: Endpoint, problem: str | None) -> None:
        if problem is None:
            if e.health.answered(self._clock()):
                self._notify(e, True)
            self._dispatch()
        elif e.health.failed(problem, self._clock(), probe=True):
            log.warning("judge endpoint %s out of the rotation: %s", e.url, problem)
            self._notify(e, False)
            self._dispatch()

    async def sync(self) -> None:
        """Publish this process's demand and learning; adopt the fleet's records and share."""
        self._probe_due_endpoints()
        now = self._clock()
        elapsed, self._last_sync = now - self._last_sync, now
        for e in self.endpoints:
            grown, e.grown = e.grown, 0.0
            if grown:
                self._adopt(e, await self.store.update(e.url, _growth(grown)))
            paced, e.paced_s = e.paced_s, 0.0
            if e.record.rpm_inferred and paced > 0 and now - e.last_429 > QUIET_S:
                # Every process probes the one shared pace: each by its part of the demand,
                # so the fleet's pace rises by RATE_PROBE per second however many there are.
                self._adopt(e, await self.store.update(e.url, _probe_rate(min(elapsed, 1.0) * e.fraction)))
        report = ProcessReport(
            self.process,
            time.time(),
            self.demand,
            {e.url: self._endpoint_report(e) for e in self.endpoints},
            self.tenant_demand(),
            self.shares.served_last_minute(),
        )
        records, fraction = await self.store.sync(report, self.urls)
        for e in self.endpoints:
            e.fraction = fraction
            self._adopt(e, records[e.url])
            self._export(e)
        metrics.JUDGE_CALLS_WAITING.set(self._waiting)
        self._dispatch()

    def _divide(self, own: ProcessReport, others: list[ProcessReport], now: float, capacity: float) -> float:
        """This process's fraction of every endpoint's limit: the tenants' fair parts of
        the fleet's capacity (:mod:`drcredit.tenancy.shares`), split between processes
        by their demand of each tenant. A process with demand never gets less than an
        even split's quarter before the others report (as :func:`demand_share`); a
        report without tenants (a process of an older release) falls back to that rule."""
        live = [r for r in others if r.process != own.process and now - r.at <= STALE_S]
        if any(r.demand > 0 and not r.tenants for r in [own, *live]):
            return demand_share(own, others, now)
        fleet: Counter[str] = Counter(own.tenants)
        served: Counter[str] = Counter(own.served)
        for r in live:
            fleet.update(r.tenants)
            served.update(r.served)
        up = sum(e.limit for e in self.endpoints if e.health.up) or capacity
        fraction = self.shares.divide(own.tenants, fleet, up, len(live) + 1)
        self._export_tenants(fleet, served)
        if own.demand > 0:
            fraction = max(fraction, 1.0 / (len(live) + 1) / 4)
        return fraction

    def _export_tenants(self, fleet: Counter[str], served: Counter[str]) -> None:
        total = sum(served.values())
        for tenant in set(served) | set(fleet):
            metrics.TENANT_FLEET_SHARE.labels(tenant).set(served[tenant] / total if total else 0.0)

    @staticmethod
    def _export(e: Endpoint) -> None:
        metrics.JUDGE_ENDPOINT_IN_FLIGHT.labels(e.url).set(e.in_flight)
        metrics.JUDGE_ENDPOINT_LIMIT.labels(e.url).set(e.limit)
        metrics.JUDGE_ENDPOINT_SHARE.labels(e.url).set(e.share)
        metrics.JUDGE_ENDPOINT_UP.labels(e.url).set(1 if e.health.up else 0)
        if e.latency.ewma is not None:
            metrics.JUDGE_ENDPOINT_LATENCY.labels(e.url).set(e.latency.ewma)
        if e.record.rpm is not None:
            metrics.JUDGE_ENDPOINT_RPM.labels(e.url).set(e.record.rpm)

    def status(self) -> list[dict[str, Any]]:
        """Each endpoint as every live process of the deployment sees it, with the
        fleet's record of it (from any thread: /readyz)."""
        reports = self.store.reports()
        records = self.store.records(self.urls)
        return [
            endpoint_status(
                e.url, records[e.url], [r.endpoints[e.url] for r in reports if e.url in r.endpoints], e.config
            )
            for e in self.endpoints
        ]

    def _adopt(self, e: Endpoint, record: EndpointRecord) -> None:
        """Take the fleet's record, keeping the growth of this process not shared yet."""
        limit = limits.capped(record.limit, e.cap(record))
        if e.grown:
            limit = limits.grow(limit, e.grown)
        e.record = replace(record, limit=limit)

    async def aclose(self) -> None:
        """Stop the reports and the health checks in flight, and let the shared updates
        already started finish: once its owner has closed the fleet, nothing of it may go
        on probing an endpoint or logging (after a test run, into streams already
        closed)."""
        loop = asyncio.get_running_loop()
        stopped = [t for t in (self._sync_task, *self._probes) if t is not None and not t.done()]
        for task in stopped:
            if task.get_loop() is loop:
                task.cancel()
            elif not task.get_loop().is_closed():
                task.get_loop().call_soon_threadsafe(task.cancel)
        ours = [t for t in (*stopped, *self._background) if t.get_loop() is loop]
        await asyncio.gather(*ours, return_exceptions=True)
        self._probes.clear()
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
