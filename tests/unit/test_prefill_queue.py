"""The calls a process lets wait for an endpoint's prefill (``judges.fleet.prefill``), one
test per rule, values worked by hand: a 1 s answer latency allows 0.05 s of queueing
(``TARGET_SHARE``) past the floor, and never less than the floor itself; with fewer than
eleven followers seen the floor is the least time to their first events, and the depth
answers to the median of the last sixteen."""

from __future__ import annotations

import asyncio

import pytest

from drcredit.judges.fleet import prefill
from drcredit.judges.fleet.affinity import CALL_AFFINITY
from drcredit.judges.fleet.endpoints import EndpointConfig
from drcredit.judges.fleet.prefill import PrefillQueue
from drcredit.judges.fleet.router import Fleet, Lease
from drcredit.judges.fleet.state import CALL_PRIORITY
from tests.support import aio


def streaming(depth: float = 8.0) -> PrefillQueue:
    queue = PrefillQueue()
    queue.depth = depth
    queue.answered(first_s=0.1, total_s=1.0)  # one streamed answer: its first event well before its end
    return queue


def filled(queue: PrefillQueue, calls: int) -> None:
    for _ in range(calls):
        queue.sent()


def test_an_endpoint_is_not_held_to_a_depth_until_it_is_seen_to_stream() -> None:
    queue = PrefillQueue()
    filled(queue, 50)
    assert not queue.full()  # nothing known: as before streaming
    queue.first_event(0.01, follows=False, sent_at=0.0, now=0.01, latency_s=None)
    assert queue.gates and queue.waiting == 49 and queue.full()  # a first event came: it streams


def test_answers_whose_first_event_comes_with_their_end_turn_the_depth_off() -> None:
    queue = streaming()
    filled(queue, 50)
    assert queue.full()
    # A buffering proxy: the first event after 95% of the call's time. The share of
    # streamed answers falls 1 -> 0.8 -> 0.64 -> 0.512 -> 0.4096 (weight 0.2).
    for share in (0.8, 0.64, 0.512):
        queue.answered(first_s=0.95, total_s=1.0)
        assert queue.streamed == pytest.approx(share) and queue.full()
    queue.answered(first_s=0.95, total_s=1.0)
    assert not queue.gates and not queue.full()
    queue.answered(first_s=None, total_s=1.0)  # an answer in one body: not streamed either
    assert not queue.gates


def test_the_depth_bounds_the_calls_waiting_for_their_first_event() -> None:
    queue = streaming(depth=3.6)
    filled(queue, 2)
    assert not queue.full()
    filled(queue, 1)
    assert queue.full()  # floor(3.6) = 3 waiting
    queue.gone()  # one answered or given up without a first event
    assert not queue.full() and queue.waiting == 2


def test_followers_that_queued_past_the_target_cut_the_depth_once_per_round() -> None:
    queue = streaming(depth=8.0)
    filled(queue, 40)
    for _ in range(4):  # first events 0.02 s after sending: the floor, no queue
        queue.first_event(0.02, follows=True, sent_at=0.0, now=0.5, latency_s=1.0)
    # Then 0.1 s: the median of the followers moves only once most of them are late:
    # four late of eight, median (0.02 + 0.1) / 2 = 0.06, queued 0.04: within 0.05.
    for _ in range(4):
        queue.first_event(0.1, follows=True, sent_at=0.6, now=1.0, latency_s=1.0)
    assert queue.depth == 8.0
    queue.first_event(0.1, follows=True, sent_at=0.6, now=1.0, latency_s=1.0)  # five of nine: 0.08
    assert queue.depth == 6.0  # 8 x 0.75
    # Sent before that cut: the same congestion, no second cut.
    queue.first_event(0.1, follows=True, sent_at=0.9, now=1.1, latency_s=1.0)
    assert queue.depth == 6.0
    queue.first_event(0.1, follows=True, sent_at=1.05, now=1.3, latency_s=1.0)  # sent after it
    assert queue.depth == 4.5


def test_the_depth_never_falls_below_two() -> None:
    queue = streaming(depth=2.2)
    filled(queue, 10)
    queue.first_event(0.5, follows=False, sent_at=0.0, now=0.5, latency_s=1.0)  # a leader sets no floor
    for _ in range(3):
        queue.first_event(0.01, follows=True, sent_at=0.0, now=1.0, latency_s=1.0)
    for _ in range(3):  # the third makes the median (0.01 + 0.5) / 2: queued 0.245
        queue.first_event(0.5, follows=True, sent_at=0.5, now=1.5, latency_s=1.0)
    assert queue.depth == prefill.MIN_DEPTH


def test_a_depth_in_use_grows_by_one_a_call_until_the_first_cut_then_by_one_a_round() -> None:
    queue = streaming(depth=4.0)
    filled(queue, 20)
    queue.first_event(0.01, follows=True, sent_at=0.0, now=0.1, latency_s=1.0)
    assert queue.depth == 4.0  # not reached since: nothing says the depth is too small
    assert queue.full()  # 19 waiting: reached
    queue.first_event(0.02, follows=True, sent_at=0.0, now=0.2, latency_s=1.0)  # median 0.015: queued 0.005
    assert queue.depth == 5.0
    assert queue.full()
    queue.first_event(0.02, follows=True, sent_at=0.0, now=0.2, latency_s=1.0)
    assert queue.depth == 6.0
    for _ in range(3):  # the third makes the median (0.02 + 0.3) / 2 = 0.16: a cut
        queue.first_event(0.3, follows=True, sent_at=0.25, now=0.6, latency_s=1.0)
    assert queue.depth == 4.5
    assert queue.full()
    # Seven followers: 0.01, 0.01, 0.02, 0.02, 0.3, 0.3, 0.3: median 0.02, queued 0.01.
    queue.first_event(0.01, follows=True, sent_at=0.7, now=0.8, latency_s=1.0)
    assert queue.depth == pytest.approx(4.5 + 1 / 4.5)


def test_without_a_known_latency_or_a_follower_the_depth_holds() -> None:
    queue = streaming(depth=8.0)
    filled(queue, 8)
    assert queue.full()
    queue.first_event(3.0, follows=True, sent_at=0.0, now=3.0, latency_s=None)  # no latency yet
    queue.first_event(3.0, follows=False, sent_at=0.0, now=3.0, latency_s=1.0)  # its own prefill is long
    assert queue.depth == 8.0


def test_the_fleet_holds_calls_past_the_depth_and_sends_the_most_urgent_first() -> None:
    async def run() -> list[int]:
        fleet = Fleet([EndpointConfig("http://judge-0/v1")])
        e = fleet.endpoints[0]
        e.prefill.depth = 2.0
        e.prefill.answered(first_s=0.1, total_s=1.0)
        placed: list[int] = []

        async def call(priority: int) -> Lease:
            CALL_PRIORITY.set(priority)
            lease = await fleet.acquire()
            placed.append(priority)
            return lease

        first = [await call(5), await call(5)]
        waiting = [asyncio.create_task(call(p)) for p in (1, 9, 3)]
        await asyncio.sleep(0.01)
        assert placed == [5, 5] and e.in_flight == 2  # two wait for their prefill: the rest here
        fleet.first_event(first[0], 0.01)  # one prefilled: the most urgent waiting goes
        await asyncio.sleep(0.01)
        fleet.release(first[1])  # one failed before its first event: its place is given back
        await asyncio.sleep(0.01)
        fleet.first_event(first[0], 0.01)  # told twice: counted once
        assert e.prefill.waiting == 2
        for task in waiting:
            task.cancel()
        await fleet.aclose()
        return placed

    assert aio.run(run()) == [5, 5, 9, 3]


def test_a_call_waits_for_its_replica_while_an_unpinned_one_takes_the_other() -> None:
    async def run() -> tuple[str, str]:
        fleet = Fleet([EndpointConfig("http://judge-0/v1"), EndpointConfig("http://judge-1/v1")])
        for e in fleet.endpoints:
            e.prefill.depth = 2.0
            e.prefill.answered(first_s=0.1, total_s=1.0)
            e.latency.track(1.0)
        a = fleet.endpoints[0]
        fleet.pins.pin("visit-7", a.url)
        a.prefill.waiting = 2  # its prefill queue is full
        CALL_AFFINITY.set("visit-7")
        CALL_PRIORITY.set(9)
        pinned = asyncio.create_task(fleet.acquire())
        await asyncio.sleep(0.01)
        assert not pinned.done()  # the visit's pages are cached there: it waits
        CALL_AFFINITY.set(None)
        CALL_PRIORITY.set(1)
        other = await asyncio.wait_for(fleet.acquire(), 1.0)  # less urgent, free to go anywhere
        a.prefill.waiting = 1
        fleet._dispatch()
        lease = await asyncio.wait_for(pinned, 1.0)
        await fleet.aclose()
        return other.endpoint.url, lease.endpoint.url

    other, pinned = aio.run(run())
    assert (other, pinned) == ("http://judge-1/v1", "http://judge-0/v1")


def test_a_hosted_apis_varying_first_tokens_do_not_cut_the_depth_within_the_floor() -> None:
    queue = streaming(depth=8.0)
    filled(queue, 30)
    # First tokens after 0.4 s with no queue at all; a 3 s answer latency allows 0.15 s.
    for seconds in (0.4, 0.4, 0.4, 0.75, 0.75, 0.75):  # median 0.575: 0.175 past, within the floor
        queue.first_event(seconds, follows=True, sent_at=0.0, now=0.8, latency_s=3.0)
    assert queue.depth == 8.0
    for _ in range(16):  # then 1.0 s: 0.6 past the floor, over both
        queue.first_event(1.0, follows=True, sent_at=0.1, now=1.2, latency_s=3.0)
    assert queue.depth == 6.0  # once: all sent before the cut


def test_the_floor_is_a_low_quantile_not_one_lucky_call() -> None:
    queue = streaming(depth=8.0)
    filled(queue, 40)
    queue.first_event(0.001, follows=True, sent_at=0.0, now=0.1, latency_s=1.0)  # one lucky call
    for _ in range(20):
        queue.first_event(0.04, follows=True, sent_at=0.0, now=0.1, latency_s=1.0)
    for _ in range(16):
        queue.first_event(0.085, follows=True, sent_at=0.05, now=0.2, latency_s=1.0)
    # 37 times: the floor is the 4th least (index int(0.1 x 36) = 3), 0.04, so the median
    # 0.085 queued 0.045 (within 0.05); against the lucky call's 0.001 it would be a cut.
    assert queue.depth == 8.0


def test_a_call_follows_when_its_prompt_head_went_to_the_endpoint_before() -> None:
    queue = PrefillQueue()
    assert not queue.sent("visit-1") and queue.sent("visit-1")
    assert not queue.sent("visit-2") and not queue.sent(None)
    assert queue.waiting == 4


def test_a_call_waits_for_a_fast_replicas_prefill_queue_rather_than_take_a_slow_one() -> None:
    async def run() -> tuple[list[str], bool, str]:
        fleet = Fleet([EndpointConfig("http://fast/v1"), EndpointConfig("http://slow/v1")])
        fast, slow = fleet.endpoints
        for e, latency in ((fast, 1.0), (slow, 3.0)):
            e.prefill.depth = 2.0
            e.prefill.answered(first_s=0.1, total_s=1.0)
            e.latency.track(latency)
        first = [await fleet.acquire(), await fleet.acquire()]  # 1.0 and 1.0 x (1 + 1/64) against 3.0
        third = asyncio.create_task(fleet.acquire())
        await asyncio.sleep(0.01)
        # The fast replica's prefill queue is full; the slow one would answer 3.0 / 1.03
        # times later, past the 1.25 an equal replica may be: the call waits.
        waited = not third.done()
        fleet.first_event(first[0], 0.01)
        lease = await asyncio.wait_for(third, 1.0)
        await fleet.aclose()
        return [x.endpoint.url for x in first], waited, lease.endpoint.url

    first, waited, third = aio.run(run())
    assert first == ["http://fast/v1"] * 2 and waited and third == "http://fast/v1"
