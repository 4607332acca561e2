"""The engine's batch writer, the bulk judgment store and how units travel in messages."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from drcredit.judges.attempts import Attempt
from drcredit.judges.base import JudgeResult
from drcredit.judges.breaker import CircuitBreaker
from drcredit.recent import Recent
from drcredit.scoring import start_order as start_order_module
from drcredit.scoring.dispatch import UnitRef, unit_batches
from drcredit.scoring.engine import BatchWriter, Engine
from drcredit.scoring.priority import PrioritySlots
from drcredit.scoring.start_order import HOLD_MARGIN, MAX_HOLD_S, StartOrder
from drcredit.scoring.work.judging import JudgeCalls
from drcredit.scoring.work.outages import JudgeOutages
from drcredit.storage import models as m
from drcredit.storage.bulk import JudgmentRow, copy_rows, held_leases, renew_leases, store_judgments
from drcredit.storage.database import Database
from drcredit.storage.histories import support_histories
from drcredit.storage.migrate import upgrade
from tests.support.infra import postgres_database

# ----------------------------------------------------------------------------- closing


def test_closing_the_engine_ends_its_thread_and_every_task_left_on_its_loop() -> None:
    """A judge fleet's health check still waiting when the engine closes (its owner
    never closed the fleet) is cancelled and run to its end, and the engine's thread is
    gone when close returns: nothing of it goes on probing or logging afterwards (once a
    test run has closed its streams, such a log was a "--- Logging error ---")."""
    from drcredit.judges.fleet.endpoints import EndpointConfig
    from drcredit.judges.fleet.health import FAILURES_TO_OPEN
    from drcredit.judges.fleet.router import Fleet

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
        for _ in range(FAILURES_TO_OPEN):
            lease = fleet._place(frozenset(), False)
            assert lease is not None
            fleet.failed(lease, "connection", "connection refused")
            fleet.release(lease)
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


# ----------------------------------------------------------------------------- bulk store


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'bulk.sqlite3'}"
        upgrade(url)
        database = Database(url)
        yield database
        database.dispose()
    else:
        with postgres_database() as url:
            upgrade(url)
            database = Database(url)
            yield database
            database.dispose()


def _group(db: Database) -> int:
    with db.session() as s:
        row = m.Group(
            tenant="t",
            group_id="g",
            content_hash="h",
            question="q",
            rubrics=[],
            params={},
            expected_rollouts=2,
            judge_backend="offline",
            judge_model="m",
        )
        s.add(row)
        s.flush()
        return row.id


def _row(group_pk: int, turn: int, level: int, points: list[str], prior: int, status: str = "ok") -> JudgmentRow:
    return JudgmentRow(
        {
            "group_pk": group_pk,
            "kind": "visit",
            "rollout_id": "r0",
            "turn_index": turn,
            "rubric_id": "R1",
            "status": status,
            "level": level,
            "support_points": points,
            "answer": {"level": level},
            "prior_support": prior,
            "cache_hit": False,
            "attempt_count": 1,
            "attempts": [
                {
                    "number": 1,
                    "outcome": "ok",
                    "error": None,
                    "latency_s": 0.5,
                    "prompt_tokens": 10,
                    "completion_tokens": 2,
                }
            ],
            "created_at": datetime.now(UTC),
        }
    )


def test_store_skips_what_is_stored_and_histories_read_back_in_turn_order(db: Database) -> None:
    group_pk = _group(db)
    with db.session() as s:
        assert store_judgments(s, [_row(group_pk, 0, 2, ["a", "b"], 0), _row(group_pk, 1, 0, [], 2)]) == {0, 1}
    # A second delivery stores turn 1 again (skipped) together with turns 2 and 3 (new);
    # turn 3 failed: whatever it holds is not support.
    with db.session() as s:
        stored = store_judgments(
            s,
            [
                _row(group_pk, 1, 0, [], 2),
                _row(group_pk, 3, 1, ["x"], 3, status="failed"),
                _row(group_pk, 2, 1, ["c"], 2),
            ],
        )
        assert stored == {1, 2}
    with db.session() as s:
        judgments = s.execute(
            select(m.Judgment.turn_index, m.Judgment.level, m.Judgment.answer, m.Judgment.attempts)
        ).all()
        histories = support_histories(s, [group_pk])
    assert sorted((t, lvl) for t, lvl, _, _ in judgments) == [(0, 2), (1, 0), (2, 1), (3, 1)]
    assert all(answer == {"level": level} for _, level, answer, _ in judgments)
    assert all([a["number"] for a in attempts] == [1] for *_, attempts in judgments)
    assert histories == {(group_pk, "r0", "R1"): [(0, "a"), (0, "b"), (2, "c")]}


def test_copied_rows_read_back_as_written_json_included(db: Database) -> None:
    group_pk = _group(db)
    with db.session() as s:
        rollout = m.Rollout(group_pk=group_pk, position=0, rollout_id="r0", content_hash="h")
        s.add(rollout)
        s.flush()
        rollout_pk = rollout.id
    # Text COPY has its own escapes (backslash, tab, newline): page text carries them all.
    awkward = {"type": "visit", "evidence": 'a\tb\n "quoted" back\\slash \\t é 中', "n": None}
    bodies = [awkward, {"type": "answer", "answer": "plain"}]
    with db.session() as s:
        copy_rows(
            s,
            m.Turn.__table__,
            ("rollout_pk", "index", "type", "body"),
            [(rollout_pk, i, b["type"], b) for i, b in enumerate(bodies)],
        )  # type: ignore[arg-type]
    with db.session() as s:
        stored = s.execute(select(m.Turn.index, m.Turn.type, m.Turn.body).order_by(m.Turn.index)).all()
    assert [(i, t, b) for i, t, b in stored] == [(i, b["type"], b) for i, b in enumerate(bodies)]


def test_a_lease_is_held_only_by_its_owner_while_running_and_renewal_moves_its_expiry(db: Database) -> None:
    group_pk = _group(db)
    expires = datetime(2030, 1, 1, tzinfo=UTC)
    with db.session() as s:
        units = [
            m.WorkUnit(
                group_pk=group_pk,
                kind="visit_chain",
                unit_key=f"u{k}",
                rollout_id="r0",
                rubric_id="R1",
                status=status,
                lease_owner="me",
                lease_expires_at=expires,
            )
            for k, status in enumerate(["running", "running", "cancelled"])
        ]
        s.add_all(units)
        s.flush()
        mine, other, cancelled = (u.id for u in units)
    asked = [(mine, "me"), (other, "someone else"), (cancelled, "me")]
    with db.session() as s:
        assert held_leases(s, asked) == {mine}
    later = datetime(2031, 1, 1, tzinfo=UTC)
    with db.session() as s:
        assert renew_leases(s, asked, later) == {mine}
    with db.session() as s:
        stored = {
            pk: at and at.replace(tzinfo=UTC)
            for pk, at in s.execute(select(m.WorkUnit.id, m.WorkUnit.lease_expires_at))
        }
    assert stored == {mine: later, other: expires, cancelled: expires}


def test_a_renewal_takes_its_units_in_id_order(db: Database) -> None:
    """Every transaction locking units takes them in id order, so two never wait on each
    other. Unit 20 is written before unit 10 (a scan meets it first); another
    transaction holds unit 10; the renewal of both waits for 10 and must not have taken
    20 meanwhile."""
    if db.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer at a time: no row locks to order")
    group_pk = _group(db)
    expires = datetime(2030, 1, 1, tzinfo=UTC)
    with db.session() as s:
        for unit_id in (20, 10):
            s.add(
                m.WorkUnit(
                    id=unit_id,
                    group_pk=group_pk,
                    kind="visit_chain",
                    unit_key=f"u{unit_id}",
                    rollout_id="r0",
                    rubric_id="R1",
                    status="running",
                    lease_owner="me",
                    lease_expires_at=expires,
                )
            )
            s.flush()
    later = datetime(2031, 1, 1, tzinfo=UTC)
    renewed: list[set[int]] = []
    with db.engine.connect() as other:
        other.exec_driver_sql("SELECT id FROM work_units WHERE id = 10 FOR UPDATE")

        def renew() -> None:
            with db.session() as s:
                renewed.append(renew_leases(s, [(20, "me"), (10, "me")], later))

        thread = threading.Thread(target=renew)
        thread.start()
        thread.join(0.5)
        assert thread.is_alive()  # waiting for unit 10
        # Unit 20 is free: the renewal waits for 10 before it takes 20.
        assert other.exec_driver_sql("SELECT id FROM work_units WHERE id = 20 FOR UPDATE NOWAIT").scalar() == 20
        other.rollback()
    thread.join(10)
    assert renewed == [{10, 20}]


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
