"""What one process learns of an endpoint reaches the others through the shared store.

Found against llama-server: a placeholder of ``_adopt`` in one part of the ``Fleet``
once hid the real one, so no process took the shared record (nor its share of the limit).
"""

from __future__ import annotations

import asyncio

from drcredit.judges.fleet.endpoints import EndpointConfig
from drcredit.judges.fleet.router import Fleet
from drcredit.judges.fleet.store import MemoryStore

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
