"""Where the fleet's learning lives: in the process (embedded) or in Redis (distributed).

Every process calling a judge endpoint reads and updates one shared record of it: the
learned limit (:mod:`drcredit.judges.fleet.limits`), the rate limits and context window
the endpoint reported, and the pacing schedules of its rate limits
(:mod:`drcredit.judges.fleet.rates`). Each process also reports, a few times a second,
how many calls it has waiting or in flight and how it sees each endpoint; its share of
an endpoint's limit is the limit split in proportion to those demands, so ten workers
together send what one endpoint takes, not ten times that, and a worker started later
begins from what the others learned. The limit math stays in Python: Redis keeps the
state, and an update is a read, a computation and a conditional write (``WATCH``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import orjson

from drcredit.judges.fleet import rates
from drcredit.judges.fleet.limits import LimitState

log = logging.getLogger("drcredit.judges.fleet")

#: A process that has not reported for this long no longer takes a share.
STALE_S = 3.0
#: Shared records of an endpoint idle this long are forgotten (learning starts again).
RECORD_TTL_S = 24 * 3600
#: Redis connections of one process's event loop, and how long a call waits for one.
POOL_SIZE = 32
POOL_WAIT_S = 10.0


@dataclass(frozen=True)
class EndpointRecord:
    """What the fleet knows of one endpoint, shared by every process calling it."""

    limit: LimitState = field(default_factory=LimitState)
    #: Requests and tokens per minute the endpoint reported in its headers, or (with
    #: ``rpm_inferred``) the pace its 429s taught (:func:`drcredit.judges.fleet.rates.inferred_rpm`).
    rpm: float | None = None
    tpm: float | None = None
    rpm_inferred: bool = False
    #: The context window (tokens) the endpoint reported, and its parallel slots.
    context_tokens: int | None = None
    slots: int | None = None

    def to_json(self) -> bytes:
        body = asdict(self)
        if math.isinf(self.limit.ssthresh):
            body["limit"]["ssthresh"] = None
        return orjson.dumps(body)

    @staticmethod
    def from_json(raw: bytes | str | None) -> EndpointRecord:
        if not raw:
            return EndpointRecord()
        body = orjson.loads(raw)
        limit = dict(body.pop("limit"))
        if limit.get("ssthresh") is None:
            limit["ssthresh"] = math.inf
        return EndpointRecord(limit=LimitState(**limit), **body)


@dataclass(frozen=True)
class ProcessReport:
    """One process's demand and its view of each endpoint, as last reported."""

    process: str
    at: float
    #: Calls waiting for an endpoint or in flight in this process.
    demand: int
    #: Per endpoint: in_flight, up, latency_s, reason, since, counts.
    endpoints: dict[str, dict[str, Any]]
    #: The demand per tenant (calls waiting or in flight), and the calls answered per
    #: tenant over the last minute (:mod:`drcredit.tenancy.shares`).
    tenants: dict[str, int] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)


#: How a process's fraction of every endpoint's limit follows from its report, the
#: others' (live or not) and the fleet's capacity (the endpoints' summed limits).
Divide = Callable[[ProcessReport, list[ProcessReport], float, float], float]


Update = Callable[[EndpointRecord], EndpointRecord]


class FleetStore(ABC):
    """The shared state of a fleet's endpoints (engine loop for the async methods).

    ``divide``: the rule of a process's share (by default :func:`demand_share`; the
    fleet sets the tenants' fair shares, :meth:`drcredit.judges.fleet.sharing.Sharing._divide`).
    """

    divide: Divide

    @abstractmethod
    async def update(self, endpoint: str, change: Update) -> EndpointRecord:
        """Apply ``change`` to the endpoint's record atomically; the new record."""

    @abstractmethod
    async def sync(self, report: ProcessReport, endpoints: list[str]) -> tuple[dict[str, EndpointRecord], float]:
        """Publish this process's report; read every endpoint's record and this
        process's share of the demand (a fraction in (0, 1])."""

    @abstractmethod
    async def reserve(self, key: str, cost: float, rate_per_s: float) -> float:
        """Reserve ``cost`` on the paced schedule ``key``; seconds to wait before the call."""

    @abstractmethod
    async def refund(self, key: str, cost: float, rate_per_s: float) -> None:
        """Give back units reserved but not used."""

    @abstractmethod
    async def defer(self, key: str, seconds: float) -> None:
        """Start no call on the schedule ``key`` within ``seconds`` (a 429 under its pace)."""

    @abstractmethod
    def reports(self) -> list[ProcessReport]:
        """Every live process's last report (from any thread, for /readyz)."""

    @abstractmethod
    def records(self, endpoints: list[str]) -> dict[str, EndpointRecord]:
        """The endpoints' shared records (from any thread, for /readyz)."""

    async def aclose(self) -> None:  # noqa: B027 - nothing to release by default
        """Release connections held for the running loop."""


def demand_share(own: ProcessReport, others: list[ProcessReport], now: float, capacity: float = 0.0) -> float:
    """This process's fraction of each endpoint's limit: its share of the live demand.

    With no demand anywhere the limit is split evenly, so the first calls of a step
    start at once in every process; a process with demand never gets less than an
    even split's quarter before the others report.
    """
    live = [r for r in others if r.process != own.process and now - r.at <= STALE_S]
    total = own.demand + sum(r.demand for r in live)
    even = 1.0 / (len(live) + 1)
    if total <= 0:
        return even
    return max(own.demand / total, even / 4 if own.demand > 0 else 0.0)


class MemoryStore(FleetStore):
    """One process is the whole deployment (embedded mode)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._records: dict[str, EndpointRecord] = {}
        self._report: ProcessReport | None = None
        self._schedules: dict[str, float] = {}
        self._clock = clock
        self.divide: Divide = demand_share

    async def update(self, endpoint: str, change: Update) -> EndpointRecord:
        record = change(self._records.get(endpoint, EndpointRecord()))
        self._records[endpoint] = record
        return record

    async def sync(self, report: ProcessReport, endpoints: list[str]) -> tuple[dict[str, EndpointRecord], float]:
        self._report = report
        records = self.records(endpoints)
        return records, self.divide(report, [], report.at, sum(r.limit.limit for r in records.values()))

    async def reserve(self, key: str, cost: float, rate_per_s: float) -> float:
        tat, wait = rates.reserve(self._schedules.get(key, 0.0), self._clock(), cost, rate_per_s)
        self._schedules[key] = tat
        return wait

    async def refund(self, key: str, cost: float, rate_per_s: float) -> None:
        if key in self._schedules:
            self._schedules[key] = rates.refund(self._schedules[key], self._clock(), cost, rate_per_s)

    async def defer(self, key: str, seconds: float) -> None:
        self._schedules[key] = rates.deferred(self._schedules.get(key, 0.0), self._clock(), seconds)

    def reports(self) -> list[ProcessReport]:
        return [self._report] if self._report is not None else []

    def records(self, endpoints: list[str]) -> dict[str, EndpointRecord]:
        return {e: self._records.get(e, EndpointRecord()) for e in endpoints}


#: One GCRA reservation (the rules of :func:`drcredit.judges.fleet.rates.reserve`,
#: ``refund`` and ``deferred``), on Redis' own clock so that processes on different hosts agree.
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local cost, rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if ARGV[4] == 'refund' then
  tat = math.max(now, tat - cost / rate)
  redis.call('SET', KEYS[1], string.format('%.6f', tat), 'EX', 3600)
  return '0'
end
if ARGV[4] == 'defer' then
  tat = math.max(tat, now + cost + burst)
  redis.call('SET', KEYS[1], string.format('%.6f', tat), 'EX', 3600)
  return '0'
end
local start = math.max(now, tat - burst)
local due = math.max(tat, start) + cost / rate
redis.call('SET', KEYS[1], string.format('%.6f', due), 'EX', 3600)
return string.format('%.6f', start - now)
"""


class RedisStore(FleetStore):
    """Every process of a deployment shares one record per endpoint in Redis.

    ``scope`` names the fleet (its endpoints), so two deployments on one Redis do not
    share demand. The async client serves the engine loop; a small synchronous one
    serves /readyz from the API's threads.
    """

    def __init__(self, url: str, scope: str):
        self.url = url
        self.scope = scope
        self._clients: dict[asyncio.AbstractEventLoop, Any] = {}
        self._sync_client: Any = None
        self._gcra: dict[asyncio.AbstractEventLoop, Any] = {}
        self.divide: Divide = demand_share

    # ------------------------------------------------------------------ keys

    @staticmethod
    def record_key(endpoint: str) -> str:
        return f"drcredit:judge:endpoint:{endpoint}"

    @property
    def reports_key(self) -> str:
        return f"drcredit:judge:processes:{self.scope}"

    # ------------------------------------------------------------------ clients

    def _client(self) -> Any:
        import redis.asyncio as aredis

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            # A blocking pool: every judge call paced under a rate reserves on it, hundreds at
            # once, and a call must wait its turn for a connection, not fail for want of one.
            pool = aredis.BlockingConnectionPool.from_url(
                self.url, max_connections=POOL_SIZE, timeout=POOL_WAIT_S, socket_timeout=5, socket_connect_timeout=5
            )
            client = aredis.Redis(connection_pool=pool)
            self._clients[loop] = client
            self._gcra[loop] = client.register_script(_GCRA)
        return client

    def _reader(self) -> Any:
        if self._sync_client is None:
            import redis

            self._sync_client = redis.Redis.from_url(self.url, socket_timeout=2, socket_connect_timeout=2)
        return self._sync_client

    async def aclose(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        self._gcra.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    # ------------------------------------------------------------------ records

    async def update(self, endpoint: str, change: Update) -> EndpointRecord:
        import redis

        client = self._client()
        key = self.record_key(endpoint)
        for _ in range(8):
            async with client.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(key)
                    current = EndpointRecord.from_json(await pipe.get(key))
                    new = change(current)
                    pipe.multi()
                    pipe.set(key, new.to_json(), ex=RECORD_TTL_S)
                    await pipe.execute()
                    return new
                except redis.WatchError:
                    continue
        raise RuntimeError(f"could not update the shared record of {endpoint}: too many concurrent writers")

    async def sync(self, report: ProcessReport, endpoints: list[str]) -> tuple[dict[str, EndpointRecord], float]:
        client = self._client()
        async with client.pipeline(transaction=False) as pipe:
            pipe.hset(self.reports_key, report.process, orjson.dumps(asdict(report)))
            pipe.expire(self.reports_key, RECORD_TTL_S)
            pipe.hgetall(self.reports_key)
            pipe.mget([self.record_key(e) for e in endpoints])
            _, _, raw_reports, raw_records = await pipe.execute()
        others = _reports(raw_reports)
        stale = [r.process for r in others if report.at - r.at > 10 * STALE_S]
        if stale:
            await client.hdel(self.reports_key, *stale)
        records = {e: EndpointRecord.from_json(raw) for e, raw in zip(endpoints, raw_records, strict=True)}
        return records, self.divide(report, others, report.at, sum(r.limit.limit for r in records.values()))

    async def reserve(self, key: str, cost: float, rate_per_s: float) -> float:
        self._client()
        script = self._gcra[asyncio.get_running_loop()]
        wait = await script(keys=[f"drcredit:judge:pace:{key}"], args=[cost, rate_per_s, rates.BURST_S, "reserve"])
        return float(wait)

    async def refund(self, key: str, cost: float, rate_per_s: float) -> None:
        self._client()
        script = self._gcra[asyncio.get_running_loop()]
        await script(keys=[f"drcredit:judge:pace:{key}"], args=[cost, rate_per_s, rates.BURST_S, "refund"])

    async def defer(self, key: str, seconds: float) -> None:
        self._client()
        script = self._gcra[asyncio.get_running_loop()]
        await script(keys=[f"drcredit:judge:pace:{key}"], args=[seconds, 1.0, rates.BURST_S, "defer"])

    def reports(self) -> list[ProcessReport]:
        now = time.time()
        return [r for r in _reports(self._reader().hgetall(self.reports_key)) if now - r.at <= STALE_S]

    def records(self, endpoints: list[str]) -> dict[str, EndpointRecord]:
        raw = self._reader().mget([self.record_key(e) for e in endpoints])
        return {e: EndpointRecord.from_json(r) for e, r in zip(endpoints, raw, strict=True)}


def _reports(raw: Mapping[bytes, bytes]) -> list[ProcessReport]:
    out = []
    for value in raw.values():
        try:
            out.append(ProcessReport(**orjson.loads(value)))
        except (orjson.JSONDecodeError, TypeError):
            continue
    return out


def with_facts(**facts: Any) -> Update:
    """An update that records what the endpoint reported (rate limits, context, slots)."""

    def change(record: EndpointRecord) -> EndpointRecord:
        known = {k: v for k, v in facts.items() if v is not None and getattr(record, k) != v}
        return replace(record, **known) if known else record

    return change
