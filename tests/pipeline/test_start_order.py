"""When units make their first judge call (:class:`~drcredit.scoring.start_order.StartOrder`):
the deepest chains first, holds for units with slack, and a visit's chains going together."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from drcredit.judges.attempts import Attempt
from drcredit.judges.base import JudgeResult
from drcredit.judges.breaker import CircuitBreaker
from drcredit.scoring import start_order as start_order_module
from drcredit.scoring.engine import Engine
from drcredit.scoring.start_order import HOLD_MARGIN, MAX_HOLD_S, StartOrder
from drcredit.scoring.work.judging import JudgeCalls
from drcredit.scoring.work.outages import JudgeOutages
from drcredit.storage.database import Database
from drcredit.storage.migrate import upgrade

# ----------------------------------------------------------------------------- start order


async def start(order: StartOrder, log: list[str], name: str, calls: int) -> None:
    """A unit waiting for its first call; logs its name once admitted."""
    await order.wait(calls)
    log.append(name)


def test_chains_waiting_to_start_go_longest_first_a_few_per_loop_iteration() -> None:
    """Waiters are admitted by priority (then arrival), ``per_tick`` per loop
    iteration, so other work runs between admissions."""

    async def scenario() -> tuple[list[str], list[int]]:
        order = StartOrder(per_tick=2)
        order.observe_latency(0.0)  # an instant judge: nothing is held, the order alone shows
        log: list[str] = []

        tasks = [
            asyncio.ensure_future(start(order, log, name, calls))
            for name, calls in [("short", 1), ("long-a", 11), ("middle", 5), ("long-b", 11), ("tiny", 1)]
        ]
        admitted = []
        while len(log) < len(tasks):
            await asyncio.sleep(0)  # one loop iteration
            admitted.append(len(log))
        await asyncio.gather(*tasks)
        return log, admitted

    log, admitted = asyncio.run(scenario())
    assert log == ["long-a", "long-b", "middle", "short", "tiny"]
    steps = [b - a for a, b in zip([0, *admitted], admitted, strict=False)]
    assert max(steps) == 2 and len([s for s in steps if s]) == 3, admitted


def test_a_long_chain_arriving_later_passes_short_ones_still_waiting() -> None:
    async def scenario() -> list[str]:
        order = StartOrder(per_tick=1)
        order.observe_latency(0.0)  # an instant judge: nothing is held
        log: list[str] = []

        early = [asyncio.ensure_future(start(order, log, f"short-{i}", 1)) for i in range(4)]
        await asyncio.sleep(0)  # the short ones queue; one admission has not run yet
        late = asyncio.ensure_future(start(order, log, "long", 9))
        await asyncio.gather(*early, late)
        return log

    log = asyncio.run(scenario())
    assert log.index("long") <= 1, log  # at most the one short chain admitted first


def test_a_cancelled_start_takes_no_admission() -> None:
    async def scenario() -> list[str]:
        order = StartOrder(per_tick=1)
        log: list[str] = []

        gone = asyncio.ensure_future(start(order, log, "gone", 9))
        kept = asyncio.ensure_future(start(order, log, "kept", 1))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.wait_for(kept, timeout=1)
        return log

    assert asyncio.run(scenario()) == ["kept"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def admitted(order: StartOrder, calls: int) -> None:
    """Admit one unit of ``calls`` calls (it is not held: no latency known, or deep enough)."""

    async def one() -> None:
        await order.wait(calls)

    asyncio.run(one())


def test_before_any_answer_a_unit_with_slack_is_held_until_the_first_call_ends() -> None:
    """A fresh process knows no latency: an 11-call chain admitted, a 1-call unit waits
    for the first judge call to end (here the chain's, after 0.15 s), not for a timer;
    an 8-call unit (exactly the margin) waits too, a 9-call one goes at once."""

    async def scenario() -> dict[str, float]:
        order = StartOrder()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await order.wait(11)
        assert order.latency_s is None and order.hold_s(1) == MAX_HOLD_S and order.hold_s(9) == 0.0
        times: dict[str, float] = {}

        async def timed(name: str, calls: int) -> None:
            await order.wait(calls)
            times[name] = loop.time() - started

        async def first_answer() -> None:
            await asyncio.sleep(0.15)
            order.observe_latency(0.15)

        await asyncio.gather(timed("short", 1), timed("margin", 8), timed("close", 9), first_answer())
        return times

    times = asyncio.run(scenario())
    assert times["close"] < 0.1, times
    assert 0.14 <= times["short"] < 0.5, times
    assert 0.14 <= times["margin"] < 0.5, times


def test_a_failed_first_call_releases_the_units_held_for_it_and_teaches_no_latency() -> None:
    async def scenario() -> tuple[float, float | None]:
        order = StartOrder()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await order.wait(11)

        async def failed_call() -> None:
            await asyncio.sleep(0.1)
            order.call_ended()

        await asyncio.gather(order.wait(1), failed_call())
        return loop.time() - started, order.latency_s

    waited, latency = asyncio.run(scenario())
    assert 0.09 <= waited < 0.5
    assert latency is None


def test_a_cold_hold_ends_at_the_cap_when_no_call_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """No call ends (a judge that never answers): the held unit goes at MAX_HOLD_S."""
    monkeypatch.setattr(start_order_module, "MAX_HOLD_S", 0.2)

    async def scenario() -> float:
        order = StartOrder()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await order.wait(11)
        await order.wait(1)
        return loop.time() - started

    waited = asyncio.run(scenario())
    assert 0.19 <= waited < 0.6, waited


def test_a_unit_the_margin_shorter_than_the_deepest_chain_waits_one_latency() -> None:
    """Deepest chain admitted with 11 calls, latency 1 s: a unit of 11 - HOLD_MARGIN = 8
    calls (3 latencies of slack) waits 1 s; one of 9 calls goes at once."""
    clock = FakeClock()
    order = StartOrder(clock=clock)
    order.observe_latency(1.0)
    admitted(order, 11)
    assert HOLD_MARGIN == 3
    assert order.hold_s(8) == 1.0
    assert order.hold_s(9) == 0.0
    assert order.hold_s(11) == 0.0


def test_units_with_more_slack_are_spread_over_it() -> None:
    """Deepest 11, latency 1 s: a 1-call unit has 10 latencies of slack, 7 beyond the
    margin. Spread, its hold is 1 s plus a share of those 7: the first is 0.618 of them
    (the golden-ratio step), and 70 such holds fall 10 into each second of [1, 8). A
    unit not asking to be spread (a visit chain) is held one latency."""
    clock = FakeClock()
    order = StartOrder(clock=clock)
    order.observe_latency(1.0)
    admitted(order, 11)
    assert order.hold_s(1, spread=True) == pytest.approx(1.0 + 0.6180339887 * 7)
    holds = [order.hold_s(1, spread=True) for _ in range(69)]
    assert all(1.0 <= h < 8.0 for h in holds)
    per_second = [sum(1 for h in [1.0 + 0.6180339887 * 7, *holds] if k <= h < k + 1) for k in range(1, 8)]
    assert all(9 <= n <= 11 for n in per_second), per_second
    # A 7-call unit has 1 latency beyond the margin: its holds stay within [1, 2).
    assert all(1.0 <= order.hold_s(7, spread=True) < 2.0 for _ in range(20))
    assert order.hold_s(1) == 1.0 and order.hold_s(7) == 1.0


def test_the_deepest_chains_calls_left_fall_with_the_latency() -> None:
    """11 calls admitted at t; 2.5 s later (latency 1 s) 9 are unanswered (8.5, the call
    under way counts): a 6-call unit is held, a 7-call unit is not. Once the chain is done
    by the estimate, nothing is held; a new deeper admission counts from its own start."""
    clock = FakeClock()
    order = StartOrder(clock=clock)
    order.observe_latency(1.0)
    admitted(order, 11)
    clock.now += 2.5
    assert order.deepest_left() == 9
    assert order.hold_s(6) == 1.0
    assert order.hold_s(7) == 0.0
    clock.now += 20
    assert order.deepest_left() < 0
    assert order.hold_s(1) == 0.0
    admitted(order, 4)  # deeper than what is left of the 11: it is now the deepest
    assert order.deepest_left() == 4
    assert order.hold_s(1) == 1.0


def test_a_shallower_admission_does_not_replace_the_deepest() -> None:
    clock = FakeClock()
    order = StartOrder(clock=clock)
    order.observe_latency(2.0)
    admitted(order, 10)
    clock.now += 2.0  # one call done: 9 left
    admitted(order, 9)  # not deeper than what is left (9 == 9)
    clock.now += 2.0
    assert order.deepest_left() == 8


def test_the_latency_is_smoothed_and_the_hold_capped() -> None:
    """Each answer moves the estimate by a tenth of its difference: 1.0, then 2.0 -> 1.1.
    A judge slower than MAX_HOLD_S holds a unit MAX_HOLD_S at most."""
    order = StartOrder(clock=FakeClock())
    order.observe_latency(1.0)
    order.observe_latency(2.0)
    assert order.latency_s == pytest.approx(1.1)
    slow = StartOrder(clock=FakeClock())
    slow.observe_latency(60.0)
    admitted(slow, 11)
    assert slow.hold_s(1) == MAX_HOLD_S


def test_the_start_order_learns_the_judges_own_time_not_the_calls_wait_for_a_turn(tmp_path: Path) -> None:
    """A call that waited 2.5 s of its 3 s for a place on a limited judge teaches a
    latency of 0.5 s: taken whole, the wait held the step's last snippet calls back for
    the whole MAX_HOLD_S under a rate limit."""
    url = f"sqlite:///{tmp_path / 'calls.sqlite3'}"
    upgrade(url)
    db = Database(url)
    engine = Engine(judge_concurrency=4, db_threads=2)
    outages = JudgeOutages(db, CircuitBreaker("http://judge.test/v1"), engine.db)
    calls = JudgeCalls(db, engine, outages, threading.Event(), claims=False, worker_id="w", lease_s=60.0)
    waited = Attempt(1, "ok", 3.0, 10, 5, waited_s=2.5)
    result: JudgeResult[Any] = JudgeResult("visit", "ok", "m", "openai", None, attempts=[waited])

    async def answered() -> JudgeResult[Any]:
        return result

    try:
        engine.submit(calls.call(1, answered)).result(10)
    finally:
        engine.close()
        db.dispose()
    assert engine.start_order.latency_s == pytest.approx(0.5)


def test_a_held_unit_queues_after_its_hold_and_a_deep_one_does_not_wait() -> None:
    """On the loop: with a 0.2 s latency, a 1-call unit behind an admitted 6-call chain
    is admitted 0.2 s later; spread, 0.2 s plus a share of its 2 latencies beyond the
    margin (0.618 of them: 0.45 s); a 5-call unit (one shorter) at once."""

    async def scenario() -> dict[str, float]:
        order = StartOrder()
        order.observe_latency(0.2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await order.wait(6)
        times: dict[str, float] = {}

        async def timed(name: str, calls: int, spread: bool = False) -> None:
            await order.wait(calls, spread)
            times[name] = loop.time() - started

        await asyncio.gather(timed("held", 1), timed("spread", 1, True), timed("close", 5))
        return times

    times = asyncio.run(scenario())
    assert times["close"] < 0.1, times
    assert 0.18 <= times["held"] < 0.3, times
    assert 0.43 <= times["spread"] < 0.6, times


def test_a_cancelled_hold_takes_no_admission() -> None:
    async def scenario() -> list[str]:
        order = StartOrder()
        order.observe_latency(0.5)
        await order.wait(11)
        log: list[str] = []
        held = asyncio.ensure_future(start(order, log, "held", 1))
        await asyncio.sleep(0.05)
        held.cancel()
        await asyncio.gather(held, return_exceptions=True)
        await start(order, log, "deep", 10)
        return log

    assert asyncio.run(scenario()) == ["deep"]


def test_start_order_needs_at_least_one_admission_per_iteration() -> None:
    with pytest.raises(ValueError, match="per_tick"):
        StartOrder(per_tick=0)


# ----------------------------------------------------------------------------- going together


def test_chains_ready_at_the_same_visit_go_together_and_the_others_neither_wait_nor_are_waited_for() -> None:
    """Three rubric chains of one rollout, each 3 calls left, behind an 11-call chain
    with a 0.2 s latency: B (ready at visit 4) and C (its previous visit not judged
    yet: next call visit 2) queue first and are held one latency; by the time A (ready
    at visit 4) queues, the deep chain has run down and A goes at once, and B with
    it; C, not at visit 4, keeps its own hold, and A does not wait for it."""
    clock = FakeClock()

    async def scenario() -> dict[str, float]:
        order = StartOrder(clock=clock)
        order.observe_latency(0.2)
        loop = asyncio.get_running_loop()
        await order.wait(11)
        started = loop.time()
        times: dict[str, float] = {}

        async def timed(name: str, visit: int) -> None:
            await order.wait(3, together=(1, "rollout-1", visit))
            times[name] = loop.time() - started

        held = [asyncio.ensure_future(timed("B", 4)), asyncio.ensure_future(timed("C", 2))]
        await asyncio.sleep(0.05)
        assert times == {}  # both held: 11 - 3 calls is past the margin
        clock.now += 0.2 * 9  # the deep chain has 2 calls left: A has no slack to spare
        await timed("A", 4)
        await asyncio.gather(*held)
        return times

    times = asyncio.run(scenario())
    assert times["A"] < 0.1, times
    assert abs(times["B"] - times["A"]) < 0.01, times  # let go with A, before its hold ends
    assert 0.18 <= times["C"] < 0.3, times  # its own hold, neither shortened nor lengthened


def test_a_chain_arriving_within_a_latency_of_its_sibling_is_not_held() -> None:
    """A went at once (the deep chain had run down); a newer 11-call chain makes B, its
    sibling at the same visit arriving 0.05 s later, one with slack: B is not held
    (its sibling's prefix is fresh at the judge), D at another visit is."""
    clock = FakeClock()

    async def scenario() -> dict[str, float]:
        order = StartOrder(clock=clock)
        order.observe_latency(0.2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        times: dict[str, float] = {}

        async def timed(name: str, visit: int) -> None:
            await order.wait(3, together=(1, "rollout-1", visit))
            times[name] = loop.time() - started

        await timed("A", 4)
        await order.wait(11)
        await asyncio.gather(timed("B", 4), timed("D", 5))
        return times

    times = asyncio.run(scenario())
    assert times["B"] < 0.1, times
    assert 0.18 <= times["D"] < 0.3, times
