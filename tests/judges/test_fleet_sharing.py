"""What one process learns of an endpoint reaches the others through the shared store.

Found against llama-server: a placeholder of ``_adopt`` in one part of the ``Fleet``
once hid the real one, so no process took the shared record (nor its share of the limit).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest
import redis

from drcredit.judges.fleet import rates
from drcredit.judges.fleet.endpoints import EndpointConfig
from drcredit.judges.fleet.router import Fleet
from drcredit.judges.fleet.store import MemoryStore, RedisStore
from tests.support.infra import REDIS_URL

URL = "http://127.0.0.1:9/v1"


def test_slots_learned_by_one_process_are_adopted_by_another() -> None:
    async def run() -> int | None:
        store = MemoryStore()
        learner = Fleet([EndpointConfig(URL)], store=store)
        other = Fleet([EndpointConfig(URL)], store=store)
        try:
            learner.learn(URL, slots=2, context_tokens=1024)
            await asyncio.sleep(0.05)  # the shared update runs in the background
            await other.sync()
            return other.by_url[URL].record.slots
        finally:
            await learner.aclose()
            await other.aclose()

    assert asyncio.run(run()) == 2


def test_hundreds_of_calls_pacing_at_once_wait_for_a_redis_connection_instead_of_failing() -> None:
    """Every call paced under a rate reserves on the shared schedule: found in a benchmark,
    a few hundred at once exhausted the client's connections and failed their units with
    ``MaxConnectionsError``."""
    scope = f"test-{uuid.uuid4().hex[:8]}"
    store = RedisStore(f"{REDIS_URL}/13", scope)
    key = f"{scope}:rpm"

    async def run() -> list[float]:
        try:
            return await asyncio.gather(*(store.reserve(key, 1.0, 100.0) for _ in range(600)))
        finally:
            await store.aclose()

    try:
        waits = asyncio.run(run())
    finally:
        redis.Redis.from_url(f"{REDIS_URL}/13").delete(f"drcredit:judge:pace:{key}")
    # 600 calls at 100/s on one schedule: each waits its turn, the last about 6 s less the burst
    assert len(waits) == 600 and max(waits) == pytest.approx(600 / 100.0 - rates.BURST_S, abs=0.3)


def test_a_429_holds_the_shared_schedule_back_for_every_process() -> None:
    """After a 429 the schedule is held on Redis' clock: the next call a process
    reserves waits out the hold (0.5 s here), and later ones a full turn each."""
    scope = f"test-{uuid.uuid4().hex[:8]}"
    store = RedisStore(f"{REDIS_URL}/13", scope)
    key = f"{scope}:rpm"

    async def run() -> list[float]:
        try:
            await store.defer(key, 0.5)
            return [await store.reserve(key, 1.0, 10.0) for _ in range(2)]
        finally:
            await store.aclose()

    try:
        first, second = asyncio.run(run())
    finally:
        redis.Redis.from_url(f"{REDIS_URL}/13").delete(f"drcredit:judge:pace:{key}")
    assert first == pytest.approx(0.5, abs=0.05)
    assert second == pytest.approx(0.6, abs=0.05)


def test_two_processes_probing_an_inferred_pace_raise_it_as_one_would() -> None:
    """Each process probes the one shared pace by its part of the demand: two processes with
    half each raise it by RATE_PROBE per second in all, not twice that."""
    clock = [100.0]

    async def run() -> float | None:
        store = MemoryStore(clock=lambda: clock[0])
        fleets = [Fleet([EndpointConfig(URL)], store=store, clock=lambda: clock[0]) for _ in range(2)]
        try:
            await store.update(URL, lambda r: replace(r, rpm=6000.0, rpm_inferred=True))
            for fleet in fleets:
                await fleet.sync()  # adopt the record; the last sync is now
            clock[0] += 1.0  # a second of calls held back by the pace, no 429 for long
            for fleet in fleets:
                e = fleet.by_url[URL]
                e.fraction, e.paced_s = 0.5, 1.0
                await fleet.sync()
            return (await store.update(URL, lambda r: r)).rpm
        finally:
            for fleet in fleets:
                await fleet.aclose()

    rpm = asyncio.run(run())
    assert rpm == pytest.approx(6000.0 * (1 + rates.RATE_PROBE * 0.5) ** 2)
