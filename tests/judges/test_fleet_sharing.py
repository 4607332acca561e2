"""What one process learns of an endpoint reaches the others through the shared store.

Found against llama-server: a placeholder of ``_adopt`` in one part of the ``Fleet``
once hid the real one, so no process took the shared record (nor its share of the limit).
"""

from __future__ import annotations

import asyncio
import uuid

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
