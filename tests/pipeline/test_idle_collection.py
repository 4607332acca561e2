"""Cyclic garbage is collected between steps, when no unit runs, not in the middle of one."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drcredit.process import IdleCollector
from tests.pipeline.test_pipeline import REPEAT, runtime, score
from tests.support.judge_server import JudgeServer


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def cycle() -> weakref.ref[Node]:
    return weakref.ref(Node())


@pytest.fixture
def quiet_collector() -> Iterator[list[int]]:
    """No automatic collection during the test (Python's 700 would take the cycles on its
    own); yields the generations collected, in order."""
    collected: list[int] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":
            collected.append(info["generation"])

    gc.collect()
    saved = gc.get_threshold()
    gc.set_threshold(10**9, saved[1], saved[2])
    gc.callbacks.append(seen)
    try:
        yield collected
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*saved)


def test_garbage_waits_while_a_delivery_runs_and_goes_once_the_process_is_idle(quiet_collector: list[int]) -> None:
    idle = IdleCollector(delay_s=0.05)

    async def main() -> tuple[bool, bool]:
        idle.started()
        garbage = cycle()
        await asyncio.sleep(0.15)
        during = garbage() is not None
        idle.finished(asyncio.get_running_loop())
        await asyncio.sleep(0.15)
        return during, garbage() is None

    during, after = asyncio.run(main())
    assert during, "collected while a delivery was running"
    assert after, "not collected once idle"
    assert idle.collections == 1
    assert quiet_collector == [1]


def test_a_delivery_starting_within_the_delay_puts_the_collection_off(quiet_collector: list[int]) -> None:
    idle = IdleCollector(delay_s=0.1)

    async def main() -> bool:
        idle.started()
        garbage = cycle()
        idle.finished(asyncio.get_running_loop())
        await asyncio.sleep(0.03)
        idle.started()  # the next delivery of the same step
        await asyncio.sleep(0.2)
        alive = garbage() is not None
        idle.finished(asyncio.get_running_loop())
        await asyncio.sleep(0.2)
        assert garbage() is None
        return alive

    assert asyncio.run(main()), "collected between two deliveries"
    assert idle.collections == 1
    assert quiet_collector == [1]


def test_only_the_last_of_overlapping_deliveries_arms_the_collection(quiet_collector: list[int]) -> None:
    idle = IdleCollector(delay_s=0.05)

    async def main() -> bool:
        idle.started()
        idle.started()
        garbage = cycle()
        idle.finished(asyncio.get_running_loop())
        await asyncio.sleep(0.15)
        alive = garbage() is not None
        idle.finished(asyncio.get_running_loop())
        await asyncio.sleep(0.15)
        return alive

    assert asyncio.run(main())
    assert idle.collections == 1


def test_work_on_another_thread_holds_the_collection_off(quiet_collector: list[int]) -> None:
    """An aggregation runs on a database or task thread, not on the loop: while it runs
    the process is not idle, and its end arms the collection on the loop."""
    idle = IdleCollector(delay_s=0.05)
    release = threading.Event()

    def aggregation(loop: asyncio.AbstractEventLoop) -> None:
        idle.started()
        release.wait(5)
        idle.finished(loop)

    async def main() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        idle.started()
        garbage = cycle()
        worker = threading.Thread(target=aggregation, args=(loop,))
        worker.start()
        idle.finished(loop)  # the units are done, the aggregation is not
        await asyncio.sleep(0.2)
        during = garbage() is not None
        release.set()
        await asyncio.to_thread(worker.join)
        await asyncio.sleep(0.2)
        return during, garbage() is None

    during, after = asyncio.run(main())
    assert during, "collected while an aggregation was running"
    assert after
    assert idle.collections == 1


def test_the_oldest_generation_is_collected_when_idle_once_it_is_due(quiet_collector: list[int]) -> None:
    idle = IdleCollector(delay_s=0.01)
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 0)  # due at once

    async def main() -> None:
        idle.started()
        cycle()
        idle.finished(asyncio.get_running_loop())
        await asyncio.sleep(0.1)

    asyncio.run(main())
    assert quiet_collector == [2]


def test_a_pipeline_collects_after_its_units_are_done(tmp_path: Path, marker_judge: JudgeServer) -> None:
    with runtime(tmp_path, marker_judge) as rt:
        idle = rt.pipeline.engine.idle_collector
        aggregate = rt.pipeline.aggregator.run
        seen_running: list[int] = []

        def watched(group_pk: int) -> None:
            seen_running.append(idle.running)  # the aggregation itself counts as work
            aggregate(group_pk)

        rt.pipeline.aggregator.run = watched  # type: ignore[method-assign]
        score(rt, REPEAT)
        assert seen_running and all(n >= 1 for n in seen_running)
        deadline = time.monotonic() + 5
        while idle.collections == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert idle.running == 0
        assert idle.collections >= 1


def test_work_ending_after_the_loop_closed_is_no_error() -> None:
    """An aggregation still running when the engine stops ends after its loop is closed."""
    idle = IdleCollector(delay_s=0.01)
    loop = asyncio.new_event_loop()
    loop.close()
    idle.started()
    idle.finished(loop)
    assert idle.running == 0
    assert idle.collections == 0
