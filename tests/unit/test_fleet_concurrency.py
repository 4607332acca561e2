"""The concurrency an endpoint is sent, against a server that queues: one test per rule,
values worked by hand from the rule (Little's law: a call sent with ``L`` in flight to
``n`` slots waits ``L / n`` service times, so ``n = L x base / latency``)."""

from __future__ import annotations

import dataclasses

import pytest

from drcredit.judges.fleet import latency, limits
from drcredit.judges.fleet.endpoints import EndpointConfig
from drcredit.judges.fleet.latency import LatencyWatch, Verdict
from drcredit.judges.fleet.limits import GROW, HOLD, QUEUE, REBASE, LimitState
from drcredit.judges.fleet.router import Fleet
from tests.support import aio


def test_a_verdict_is_the_median_latency_over_the_base_and_the_median_slots_implied() -> None:
    # base 2 s; five answers (latency, calls in flight when sent):
    samples = [(2.0, 10.0), (4.0, 64.0), (6.0, 96.0), (8.0, 128.0), (4.0, 60.0)]
    verdict = latency.verdict_of(samples, base=2.0)
    # latencies sorted 2, 4, 4, 6, 8: median 4 -> ratio 2; loads sorted 10, 60, 64, 96, 128: 64;
    # slots: 10x2/2 = 10, 64x2/4 = 32, 96x2/6 = 32, 128x2/8 = 32, 60x2/4 = 30 -> sorted 10, 30, 32, 32, 32: 32
    assert verdict == Verdict(ratio=2.0, load=64.0, slots=32.0)


@pytest.mark.parametrize(
    ("state", "verdict", "kw", "action"),
    [
        (LimitState(), None, {}, GROW),  # too few answers yet: slow start grows
        (LimitState(), None, {"late_one": True}, HOLD),  # in slow start, an answer late on its own
        (LimitState(), Verdict(1.9, 64, 40), {}, GROW),  # within 2x
        (LimitState(), Verdict(2.1, 64, 40), {}, QUEUE),  # over 2x: a queue
        (LimitState(40, 40, 1, queues=True), Verdict(1.9, 40, 32), {}, GROW),  # known queue, within 2x
        (LimitState(40, 40, 1, queues=True), Verdict(1.2, 40, 32), {"late_one": True}, GROW),  # past slow start
        # Late again right after a queue cut, from calls within it, the old ones answered: slower server.
        (LimitState(40, 40, 1, queues=True), Verdict(2.5, 40, 16), {"after_queue_cut": True}, REBASE),
        # ... the same with calls from before the cut still out, or sent beyond the limit: a queue.
        (
            LimitState(40, 40, 1, queues=True),
            Verdict(2.5, 40, 16),
            {"after_queue_cut": True, "drained": False},
            QUEUE,
        ),
        (LimitState(40, 40, 1, queues=True), Verdict(2.5, 64, 16), {"after_queue_cut": True}, QUEUE),
    ],
)
def test_what_a_verdict_asks_of_the_limit(
    state: LimitState, verdict: Verdict | None, kw: dict[str, bool], action: str
) -> None:
    assert limits.respond(state, verdict, **kw) == action


def test_a_queue_sets_the_limit_to_the_slots_with_the_headroom_once_per_round() -> None:
    after = limits.queued(LimitState(limit=256.0), sent_epoch=0, slots=32.0)
    assert after == LimitState(limit=40.0, ssthresh=40.0, epoch=1, queues=True, slots=32.0)  # 32 x 1.25
    assert limits.queued(after, sent_epoch=0, slots=8.0) is after  # sent before the cut
    # An estimate above the limit does not raise it, but ends slow start.
    kept = limits.queued(LimitState(limit=64.0), sent_epoch=0, slots=100.0)
    assert (kept.limit, kept.ssthresh, kept.slow_start) == (64.0, 64.0, False)


def test_a_timeout_under_load_bounds_the_slots_by_load_times_base_over_the_wait() -> None:
    # 200 in flight when sent, base 2 s, no answer in 20 s: fewer than 200 x 2 / 20 = 20 slots.
    after = limits.timed_out(LimitState(limit=100.0), sent_epoch=0, load=200.0, base=2.0, waited_s=20.0)
    assert after == LimitState(limit=25.0, ssthresh=25.0, epoch=1, queues=True, slots=20.0)  # 20 x 1.25
    # A bound above 0.7x the limit: the error cut (100 x 0.7).
    loose = limits.timed_out(LimitState(limit=100.0), sent_epoch=0, load=2000.0, base=2.0, waited_s=20.0)
    assert loose.limit == pytest.approx(70.0)
    # No latency known yet: the error cut alone.
    assert limits.timed_out(LimitState(limit=100.0), 0, 200.0, None, 20.0).limit == pytest.approx(70.0)
    assert limits.timed_out(after, sent_epoch=0, load=200.0, base=2.0, waited_s=20.0) is after


def test_a_declared_rate_floors_the_limit_at_twice_the_calls_it_keeps_in_flight() -> None:
    # 9,000 a minute = 150/s at 1.2 s a call: 180 in flight, twice that 360.
    assert limits.rate_floor(9000.0, 1.2) == pytest.approx(360.0)
    assert limits.at_least(LimitState(limit=64.0), 360.0).limit == 360.0
    assert limits.at_least(LimitState(limit=400.0), 360.0).limit == 400.0  # never lowered
    assert limits.at_least(LimitState(limit=64.0, cap=100.0), 360.0).limit == 100.0  # within its cap


def test_the_base_is_a_low_quantile_of_the_recent_medians_and_a_rebase_takes_the_median() -> None:
    watch = LatencyWatch()
    for _ in range(latency.RECENT):
        watch.observe(2.0)
    assert watch.base == 2.0  # one median so far
    # 9 more answers at 3 s: the medians after each: 2 (the window still mostly 2 s) until
    # the 9th 3 s answer makes the 9th smallest 3; ten medians, the lowest tenth's index 1: 2.
    for _ in range(9):
        watch.observe(3.0)
    assert watch.base == 2.0
    # A slower server: once 90% of the remembered medians are 3 s, the base is 3.
    for _ in range(100):
        watch.observe(3.0)
    assert watch.base == 3.0
    watch.observe(1.0, 1.0)
    assert watch.base == 3.0  # one quick answer does not move the window's median
    watch.rebase()
    assert watch.base == 3.0 and not watch.after_queue_cut


def test_a_first_wave_into_few_slots_takes_its_base_from_the_calls_sent_with_fewest_ahead() -> None:
    # 12 calls at once into 2 slots of 1 s, then each answer replaced: answers 1 s, 1, 2, 2,
    # ..., 6, 6 (sent with 1, 2, ..., 12 out), then four at 6 s (sent with 12 out).
    watch = LatencyWatch()
    for k in range(12):
        watch.observe(float(k // 2 + 1), float(k + 1))
    for _ in range(4):
        verdict = watch.observe(6.0, 12.0)
    # The window's median latency is 5 s; its median load 12, and the six sent with at
    # most 6 out answered in 1, 1, 2, 2, 3, 3 s: their median (the 4th smallest) is 2.
    assert watch.base == 2.0
    assert verdict is not None and verdict.ratio == 5.0 / 2.0


def test_one_late_answer_is_told_against_the_base_or_the_first_answers_median() -> None:
    watch = LatencyWatch()
    assert not watch.late(100.0)  # nothing to compare with
    for took in (1.0, 1.0, 2.0, 1.0):
        watch.observe(took)
    # the first four: median (the 3rd smallest of 1, 1, 1, 2) is 1: late past 1.5
    assert watch.late(1.6) and not watch.late(1.5)


def test_a_timeout_while_the_endpoint_answers_others_cuts_the_limit_and_keeps_it_in_the_rotation() -> None:
    async def run() -> tuple[Fleet, float]:
        clock = [0.0]
        fleet = Fleet([EndpointConfig("http://judge-0/v1")], clock=lambda: clock[0])
        e = fleet.endpoints[0]
        e.record = dataclasses.replace(e.record, limit=LimitState(100.0))
        for _ in range(latency.RECENT):
            e.latency.observe(2.0)  # base 2 s
        e.in_flight = 199
        lease = fleet._lease(e, probe=False)  # 200 in flight with it
        clock[0] = 10.0
        e.health.answered(clock[0])  # another call answered meanwhile
        clock[0] = 20.0
        for _ in range(5):  # more than it takes to open the breaker
            fleet.failed(lease, "timeout", "no answer within 20s")
        return fleet, e.record.limit.limit

    fleet, limit = aio.run(run())
    e = fleet.endpoints[0]
    assert limit == pytest.approx(200 * 2.0 / 20.0 * limits.HEADROOM)  # 25
    assert e.health.up and e.health.failures == 0 and e.counts["timeout"] == 5
    assert e.latency.held == 2.0  # a queue: the base no longer rises on its own


def test_late_answers_under_load_cut_the_limit_to_the_slots_and_hold_the_base() -> None:
    async def run() -> Fleet:
        fleet = Fleet([EndpointConfig("http://judge-0/v1")], clock=lambda: 0.0)
        e = fleet.endpoints[0]
        e.record = dataclasses.replace(e.record, limit=LimitState(100.0, ssthresh=50.0))
        # 16 answers in 1 s, each sent with 25 in flight (the base: 1 s), then 8 answers in
        # 4 s, each sent with 100 in flight (busy).
        for took, in_flight in [(1.0, 24)] * latency.RECENT + [(4.0, 99)] * (latency.RECENT // 2):
            e.in_flight = in_flight
            fleet.answered(fleet._lease(e, probe=False), took)
        return fleet

    e = aio.run(run()).endpoints[0]
    # The 8th answer in 4 s makes the median of the last 16 (their 9th smallest) 4x the
    # base: every answer implies 25 slots (25 x 1 / 1 and 100 x 1 / 4), and the limit is
    # cut from about 100 to 25 x 1.25.
    assert e.record.limit.queues and e.record.limit.slots == pytest.approx(25.0)
    assert e.record.limit.limit == pytest.approx(25.0 * limits.HEADROOM)
    assert e.latency.held == 1.0 and e.latency.after_queue_cut


def test_a_timeout_when_nothing_answers_counts_toward_taking_the_endpoint_out() -> None:
    async def run() -> Fleet:
        clock = [0.0]
        fleet = Fleet([EndpointConfig("http://judge-0/v1")], clock=lambda: clock[0])
        e = fleet.endpoints[0]
        e.health.answered(0.0)  # its last answer
        lease = fleet._lease(e, probe=False)
        lease.sent_at = 150.0
        clock[0] = 250.0  # no answer in the 200 s before: not a queue
        fleet.failed(lease, "timeout", "no answer within 100s")
        return fleet

    assert aio.run(run()).endpoints[0].health.failures == 1


def test_slow_starts_new_room_goes_out_at_the_share_per_half_a_latency() -> None:
    state = LimitState(limit=256.0)
    assert limits.SLOW_START_SPREAD == 0.5
    # 70 in flight, 64 shown taken: the 6 beyond go at 256 per half second over 1 s answers
    assert limits.growth_pace(state, in_flight=70, proven=64.0, share=256, latency_s=1.0) == 512.0
    assert limits.growth_pace(state, in_flight=64, proven=64.0, share=256, latency_s=1.0) is None
    # past slow start: additive increase adds a few a round, no pace
    done = LimitState(limit=256.0, ssthresh=100.0)
    assert limits.growth_pace(done, in_flight=200, proven=64.0, share=256, latency_s=1.0) is None


def _queue_growing_over_seconds(watch: LatencyWatch) -> Verdict | None:
    """300 answers at 1 s, a queue cut (held or not by the caller), then 320 answers whose
    latency a queue growing a few calls a round takes from 1 s to 3 s."""
    for _ in range(300):
        watch.observe(1.0, 64.0)
    verdict = None
    for k in range(320):
        verdict = watch.observe(1.0 + 2.0 * (k + 1) / 320, 64.0)
    return verdict


def test_after_a_queue_cut_the_base_does_not_follow_a_growing_queue_up() -> None:
    # Held at the cut (base 1 s): the last answers, at 3 s, are 3x the base: a queue.
    held = LatencyWatch()
    for _ in range(300):
        held.observe(1.0, 64.0)
    held.hold()
    held.forget_recent()
    for k in range(320):
        verdict = held.observe(1.0 + 2.0 * (k + 1) / 320, 64.0)
    assert held.base == 1.0
    # the last 16 answers' median is the 9th of them (k = 312): 1 + 2 x 313 / 320 s
    assert verdict is not None and verdict.ratio == pytest.approx(1.0 + 2.0 * 313 / 320)
    # Not held (no cut yet): the 256 medians remembered are all from the rise, their
    # lowest tenth is from its first third, and the same answers read as under 2x late.
    free = LatencyWatch()
    verdict = _queue_growing_over_seconds(free)
    assert free.base is not None and free.base > 1.5
    assert verdict is not None and verdict.ratio < limits.INFLATION


def test_a_held_base_still_falls_for_a_faster_server_and_a_rebase_lifts_it() -> None:
    watch = LatencyWatch()
    for _ in range(300):
        watch.observe(2.0, 8.0)
    watch.hold()
    assert watch.held == 2.0
    for _ in range(300):
        watch.observe(1.0, 8.0)  # faster: the base follows at once
    assert watch.base == 1.0
    watch.hold()  # a second cut never raises what is held
    assert watch.held == 1.0
    for _ in range(300):
        watch.observe(4.0, 8.0)  # slower: held at 1 s until a rebase says so
    assert watch.base == 1.0
    watch.rebase()
    assert watch.base == 4.0 and watch.held == 4.0
    for _ in range(300):
        watch.observe(5.0, 8.0)
    assert watch.base == 4.0  # held again at the rebased value
