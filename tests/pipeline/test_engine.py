"""The engine: closing, its batch writer, the judge slots, and how units travel in
messages."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from drcredit.recent import Recent
from drcredit.scoring.dispatch import UnitRef, unit_batches
from drcredit.scoring.engine import BatchWriter, Engine
from drcredit.scoring.priority import PrioritySlots

# ----------------------------------------------------------------------------- closing


def test_closing_the_engine_ends_its_thread_and_every_task_left_on_its_loop() -> None:
    """A judge fleet's health check still waiting when the engine closes (its owner
    never closed the fleet) is cancelled and run to its end, and the engine's thread is
    gone when close returns: nothing of it goes on probing or logging afterwards (once a
    test run has closed its streams, such a log was a "--- Logging error ---")."""
    from drcredit.judges.fleet.endpoints import EndpointConfig
    from drcredit.judges.fleet.router import Fleet
    from tests.support.fleet import start_a_health_check

    engine = Engine(judge_concurrency=4, db_threads=1)
    ended: list[str] = []

    async def prober(config: EndpointConfig) -> str | None:
        try:
            await asyncio.sleep(3600)
        finally:
            ended.append(threading.current_thread().name)
        return None

    async def fail_an_endpoint() -> threading.Thread:
        fleet = Fleet([EndpointConfig("http://judge-0/v1")], prober=prober)
        start_a_health_check(fleet, "connection refused")
        await asyncio.sleep(0.01)  # its health check is now waiting
        return threading.current_thread()

    thread = engine.submit(fail_an_endpoint()).result(10)
    assert thread.name == "drcredit-engine" and not ended
    engine.close()
    assert ended == ["drcredit-engine"]  # cancelled, on the loop, before close returned
    assert not thread.is_alive()


# ----------------------------------------------------------------------------- batch writer


def test_writes_made_while_a_batch_is_written_form_the_next_batch() -> None:
    engine = Engine(judge_concurrency=4, db_threads=2)
    batches: list[list[int]] = []
    release = threading.Event()

    def write(items: Sequence[int]) -> list[int]:
        if not batches:
            release.wait(5)  # hold the first batch until the others have queued
        batches.append(list(items))
        return [i * 10 for i in items]

    writer: BatchWriter[int, int] = BatchWriter(engine, write, concurrency=1)

    async def main() -> list[int]:
        first = asyncio.ensure_future(writer.put(0))
        await asyncio.sleep(0.05)
        rest = [asyncio.ensure_future(writer.put(i)) for i in range(1, 6)]
        await asyncio.sleep(0.05)
        release.set()
        return await asyncio.gather(first, *rest)

    try:
        results = engine.submit(main()).result(10)
    finally:
        engine.close()
    assert results == [0, 10, 20, 30, 40, 50]
    assert batches == [[0], [1, 2, 3, 4, 5]]


def test_a_lingering_writer_gathers_writes_that_arrive_within_its_linger_into_one_batch() -> None:
    engine = Engine(judge_concurrency=4, db_threads=2)
    batches: list[list[int]] = []

    def write(items: Sequence[int]) -> list[int]:
        batches.append(list(items))
        return list(items)

    writer: BatchWriter[int, int] = BatchWriter(engine, write, concurrency=3, linger_s=0.2)

    async def main() -> list[int]:
        puts = []
        for i in range(4):
            puts.append(asyncio.ensure_future(writer.put(i)))
            await asyncio.sleep(0.02)  # one write every 20 ms: without the linger, a batch each
        return await asyncio.gather(*puts)

    try:
        results = engine.submit(main()).result(10)
    finally:
        engine.close()
    assert results == [0, 1, 2, 3]
    assert batches == [[0, 1, 2, 3]]


def test_a_failed_batch_fails_each_of_its_writes_and_the_writer_goes_on() -> None:
    engine = Engine(judge_concurrency=4, db_threads=2)
    calls = 0

    def write(items: Sequence[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("database went away")
        return list(items)

    writer: BatchWriter[int, int] = BatchWriter(engine, write, concurrency=1)

    async def main() -> tuple[list[BaseException | int], int]:
        failed = await asyncio.gather(writer.put(1), return_exceptions=True)
        return failed, await writer.put(2)

    try:
        failed, after = engine.submit(main()).result(10)
    finally:
        engine.close()
    assert isinstance(failed[0], RuntimeError) and after == 2


# ----------------------------------------------------------------------------- judge slots


def test_a_freed_slot_goes_to_the_waiter_with_the_most_work_left_then_first_come() -> None:
    async def scenario() -> list[str]:
        slots = PrioritySlots(1)
        order: list[str] = []
        await slots.acquire(0)  # the one slot is taken

        async def wait(name: str, priority: int) -> None:
            async with slots.slot(priority):
                order.append(name)

        waiters = []
        for name, priority in [("short", 1), ("long-a", 5), ("middle", 3), ("long-b", 5)]:
            waiters.append(asyncio.ensure_future(wait(name, priority)))
            await asyncio.sleep(0)  # queued in this order
        slots.release()
        await asyncio.gather(*waiters)
        return order

    assert asyncio.run(scenario()) == ["long-a", "long-b", "middle", "short"]


def test_a_cancelled_waiter_does_not_keep_a_slot() -> None:
    async def scenario() -> bool:
        slots = PrioritySlots(1)
        await slots.acquire(0)
        gone = asyncio.ensure_future(slots.acquire(9))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        slots.release()
        # The slot is free again, not handed to the cancelled waiter.
        await asyncio.wait_for(slots.acquire(1), timeout=1)
        return True

    assert asyncio.run(scenario())


# ----------------------------------------------------------------------------- messages


def test_units_travel_per_group() -> None:
    units = [
        UnitRef("visit_chain", 1, 7, "r0"),
        UnitRef("visit_chain", 2, 7, "r1"),
        UnitRef("visit_chain", 3, 7, "r0"),
        UnitRef("snippet", 4, 7, "r0"),
        UnitRef("snippet", 5, 7, "r1"),
        UnitRef("snippet", 6, 8, "r0"),
    ]
    assert [[u.unit_id for u in b] for b in unit_batches(units)] == [[1, 2, 3], [4, 5], [6]]
    many = [UnitRef("visit_chain", i, 1, f"r{i % 8}") for i in range(40)]
    assert [len(b) for b in unit_batches(many, size=16)] == [16, 16, 8]
    outcome = [UnitRef("outcome", 9, 7, "r0"), UnitRef("outcome", 10, 7, "r1")]
    assert [[u.unit_id for u in b] for b in unit_batches(outcome)] == [[9], [10]]


def test_only_deadlocks_and_serialization_failures_count_as_lock_conflicts() -> None:
    import psycopg
    from sqlalchemy.exc import IntegrityError, OperationalError

    from drcredit.storage.database import is_lock_conflict

    assert is_lock_conflict(OperationalError("UPDATE", {}, psycopg.errors.DeadlockDetected("deadlock")))
    assert is_lock_conflict(OperationalError("UPDATE", {}, psycopg.errors.SerializationFailure("conflict")))
    assert not is_lock_conflict(OperationalError("UPDATE", {}, psycopg.OperationalError("server closed")))
    assert not is_lock_conflict(IntegrityError("INSERT", {}, psycopg.errors.UniqueViolation("dup")))


def test_recent_forgets_the_least_recently_used_entry() -> None:
    cache: Recent[str, int] = Recent(size=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recently used
    cache.put("c", 3)
    assert "b" not in cache and cache.get("b") is None
    assert cache.get("a") == 1 and cache.get("c") == 3


def test_recent_keeps_the_summed_weights_within_its_budget() -> None:
    cache: Recent[str, str] = Recent(size=100, budget=10)
    cache.put("a", "A", 4)
    cache.put("b", "B", 4)
    assert cache.get("a") == "A"  # b is now the least recently used
    cache.put("c", "C", 4)  # 12 > 10: b goes
    assert "b" not in cache and len(cache) == 2 and cache.weight == 8
    cache.put("a", "A2", 1)  # a put again replaces its weight, not adds to it
    assert cache.weight == 5 and cache.get("a") == "A2"
    cache.put("d", "D", 20)  # heavier than the budget alone: kept, the others go
    assert len(cache) == 1 and cache.get("d") == "D" and cache.weight == 20


def test_a_call_handed_a_slot_takes_its_waiting_siblings_ahead_of_others_of_its_priority() -> None:
    """Slots full; waiting: S1 and S2 (the same visit, 3 calls left) with X (3 calls
    left, another rollout) between them, and H (5 calls left) last. H goes first (more
    work left), then S1, and S2 beside it, passing X; never passing H."""

    async def scenario() -> list[str]:
        slots = PrioritySlots(1)
        await slots.acquire(0)
        log: list[str] = []

        async def take(name: str, priority: int, together: tuple[int, str, int] | None) -> None:
            await slots.acquire(priority, together)
            log.append(name)
            await asyncio.sleep(0)
            slots.release()

        tasks = []
        for name, priority, together in [
            ("S1", 3, (1, "rollout-1", 4)),
            ("X", 3, (1, "rollout-2", 4)),
            ("S2", 3, (1, "rollout-1", 4)),
            ("H", 5, None),
        ]:
            tasks.append(asyncio.ensure_future(take(name, priority, together)))
            await asyncio.sleep(0)
        slots.release()
        await asyncio.gather(*tasks)
        return log

    assert asyncio.run(scenario()) == ["H", "S1", "S2", "X"]
