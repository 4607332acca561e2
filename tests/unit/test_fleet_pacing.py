"""The judge fleet's rate pacing, one test per rule, values worked by hand: GCRA reservations
and refunds, what rate-limit headers say, and the rate inferred from 429s."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from drcredit.judges.fleet import rates
from drcredit.judges.fleet.endpoints import EndpointConfig
from drcredit.judges.fleet.router import Fleet
from drcredit.judges.fleet.state import Endpoint
from drcredit.judges.fleet.store import MemoryStore
from tests.support import aio

# ----------------------------------------------------------------------------- rate pacing


def test_gcra_spaces_calls_at_the_rate_with_a_small_burst() -> None:
    # 10 calls a second: one every 0.1 s; a burst of 0.1 s lets a call start that early.
    tat, wait = rates.reserve(0.0, now=100.0, cost=1, rate_per_s=10, burst_s=0.1)
    assert (tat, wait) == (100.1, 0.0)
    tat, wait = rates.reserve(tat, now=100.0, cost=1, rate_per_s=10, burst_s=0.1)
    assert (tat, wait) == (pytest.approx(100.2), 0.0)  # within the burst
    tat, wait = rates.reserve(tat, now=100.0, cost=1, rate_per_s=10, burst_s=0.1)
    assert (tat, wait) == (pytest.approx(100.3), pytest.approx(0.1))


def test_tokens_are_reserved_by_their_count_and_refunded() -> None:
    # 600 tokens a minute = 10 a second: an estimate of 50 tokens takes 5 s of schedule.
    tat, _ = rates.reserve(0.0, now=10.0, cost=50, rate_per_s=10)
    assert tat == 15.0
    # The answer used 30: 20 come back; a refund never moves the schedule before now.
    assert rates.refund(tat, now=10.0, cost=20, rate_per_s=10) == 13.0
    assert rates.refund(tat, now=14.0, cost=40, rate_per_s=10) == 14.0


def test_turns_that_fell_in_a_cooling_are_spent_when_it_ends_not_taken_again() -> None:
    """Ten calls paced at 20 a second take turns 0-0.45 s (less the 0.1 s burst
    allowance: the last goes at 0.35 s); a 429 cools the endpoint for 0.3 s meanwhile.
    The quota refilled while nothing was sent: each call goes at the later of its turn
    and the cooling's end (all by 0.35 s), not on a second turn after the first ten
    (0.75 s)."""

    async def run() -> float:
        fleet = Fleet([EndpointConfig("http://judge-0/v1", max_concurrency=10)])
        e = fleet.endpoints[0]
        e.record = dataclasses.replace(e.record, rpm=1200.0)
        leases = [fleet._place(frozenset(), False) for _ in range(10)]
        assert all(leases)
        e.cool_until = fleet._clock() + 0.3
        started = time.monotonic()
        await asyncio.gather(*(fleet.pace(lease, 100.0) for lease in leases if lease is not None))
        return time.monotonic() - started

    took = aio.run(run())
    assert 0.3 <= took < 0.55


def test_a_429_under_the_pace_spends_its_burst_and_holds_the_next_call_back() -> None:
    # Paced at 10 a second, the schedule's next turn is at 100.05: with the 0.1 s burst a
    # call could start at once. A 429 at 100.0 asking 0.1 s moves the turn to 100.2 (100.0
    # + 0.1 + the burst, spent): the next call waits 0.1 s, the one after a full turn more.
    tat = rates.deferred(100.05, now=100.0, seconds=0.1, burst_s=0.1)
    assert tat == pytest.approx(100.2)
    tat, wait = rates.reserve(tat, now=100.0, cost=1, rate_per_s=10, burst_s=0.1)
    assert wait == pytest.approx(0.1)
    _, wait = rates.reserve(tat, now=100.0, cost=1, rate_per_s=10, burst_s=0.1)
    assert wait == pytest.approx(0.2)
    # A schedule already further ahead than the 429 asks is left as it is.
    assert rates.deferred(105.0, now=100.0, seconds=0.1, burst_s=0.1) == 105.0


def test_a_429s_retry_after_wins_over_the_windows_reset() -> None:
    """The window's reset is when it is full again (a second here); the retry-after of a
    429, when it has one, is when the next call may go."""
    window = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s"}
    assert rates.read_headers({**window, "retry-after-ms": "25"}, 429).wait_s == pytest.approx(0.025)
    assert rates.read_headers(window, 429).wait_s == pytest.approx(1.0)


def test_rate_headers_give_the_limits_per_minute() -> None:
    got = rates.read_headers({"X-RateLimit-Limit-Requests": "9000", "x-ratelimit-limit-tokens": "2000000"}, 200)
    assert got == rates.RateHeaders(rates.RateLimits(9000, 2_000_000), None)


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after-ms": "250", "retry-after": "1"}, 0.25),
        ({"retry-after": "999"}, rates.MAX_RETRY_AFTER_S),
        ({}, None),
    ],
)
def test_a_429_waits_its_retry_after(headers: dict[str, str], wait: float | None) -> None:
    assert rates.read_headers(headers, 429).wait_s == wait


def test_a_retry_after_date_is_read_against_the_clock() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    header = {"retry-after": format_datetime(now + timedelta(seconds=3), usegmt=True)}
    assert rates.read_headers(header, 429, now=now.timestamp()).wait_s == pytest.approx(3.0)


def test_an_exhausted_window_waits_for_its_reset() -> None:
    headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "0m30.5s"}
    assert rates.read_headers(headers, 200).wait_s == pytest.approx(30.5)
    headers["x-ratelimit-reset-requests"] = "6m0s"
    assert rates.read_headers(headers, 200).wait_s == rates.MAX_RETRY_AFTER_S
    headers["x-ratelimit-reset-requests"] = "20ms"
    assert rates.read_headers(headers, 200).wait_s == pytest.approx(0.02)
    headers["x-ratelimit-remaining-requests"] = "3"
    assert rates.read_headers(headers, 200).wait_s is None


def test_the_rate_a_429_teaches_is_the_accepted_rate_with_a_margin() -> None:
    # From t=10 to t=12: 300 calls sent, 20 of them refused: 280 accepted over 2 s.
    sent = [10 + i / 150 for i in range(300)]
    refused = sent[-20:]
    got = rates.inferred_rpm(sent, refused, since=10.0, now=12.0)
    assert got == pytest.approx(60 * 280 / 2 * rates.INFERRED_MARGIN)
    assert rates.inferred_rpm(sent, refused, since=11.9, now=12.0) is None  # too short to measure
    assert rates.inferred_rpm([], [], since=10.0, now=12.0) is None
    # Calls began after the window opened: the span starts at the first of them.
    late = [11.0 + i / 100 for i in range(50)]
    assert rates.inferred_rpm(late, [], since=10.0, now=11.5) == pytest.approx(60 * 50 / 0.5 * rates.INFERRED_MARGIN)


def test_an_inferred_rate_probes_upward_while_quiet() -> None:
    assert rates.probed_rpm(6000, 2.0) == pytest.approx(6000 * (1 + 2 * rates.RATE_PROBE))


def _a_429(
    now: float,
    *,
    rpm: float | None,
    sent: list[float],
    inferred_at: float | None = None,
    wait_s: float | None = None,
) -> tuple[Endpoint, float]:
    """One endpoint paced at ``rpm`` (inferred), calls sent at ``sent``, refuses the
    last of them with a 429 at ``now``: the endpoint afterwards (its shared record
    adopted) and how long the refused call holds off."""

    async def run() -> tuple[Endpoint, float]:
        fleet = Fleet([EndpointConfig("http://judge-0/v1")], clock=lambda: now)
        e = fleet.endpoints[0]
        e.record = dataclasses.replace(e.record, rpm=rpm, rpm_inferred=rpm is not None)
        e.inferred_at = inferred_at
        e.sent.extend(sent)
        lease = fleet._lease(e, probe=False)
        lease.sent_at = sent[-1]
        hold_off = fleet.rate_limited(lease, rates.RateHeaders(rates.RateLimits(), wait_s=wait_s))
        fleet.release(lease)
        await asyncio.sleep(0)  # the shared record's update
        return e, hold_off

    return aio.run(run())


def test_a_later_429_sets_the_pace_to_what_the_quota_refilled_up_as_well_as_down() -> None:
    """Paced at 3,000 a minute since a 429 at t=10; by the next 429, at t=11, 90 calls
    sent in between were accepted: the quota refilled 90 in that second (its bucket was
    empty at both 429s), so the pace becomes 90 x 60 with the margin: raised."""
    sent = [10.0 + (i + 1) / 90 for i in range(90)] + [11.0]
    e, _ = _a_429(11.0, rpm=3000.0, inferred_at=10.0, sent=sent)
    assert e.record.rpm == pytest.approx(60 * 90 / (1.0 - 1 / 90) * rates.INFERRED_MARGIN)


def test_a_429_after_a_pause_in_the_calls_is_measured_like_a_first_one() -> None:
    """Paced at 9,000 a minute since a 429 at t=10; then no call from t=11 to t=20 (the
    quota's bucket refilled), and 150 a second again until a 429 at t=22. Measured back
    to t=10, the 450 accepted over 12 s would set the pace to about 2,100; after a pause
    the 429 is measured over the window before it (300 in 2 s), as a first one, and the
    pace never rises on such a measure."""
    assert rates.longest_pause([10.5, 10.9, 21.0], since=10.0, now=22.0) == pytest.approx(10.1)
    sent = [10.0 + (i + 1) / 150 for i in range(150)] + [20.0 + (i + 1) / 150 for i in range(299)] + [22.0]
    e, _ = _a_429(22.0, rpm=9000.0, inferred_at=10.0, sent=sent)
    window = 60 * 299 / (2.0 - 1 / 150) * rates.INFERRED_MARGIN  # about 8,550: lower than 9,000, taken
    assert e.record.rpm == pytest.approx(window)


@pytest.mark.parametrize(("pace", "cooled", "hold_off"), [(None, True, 0.0), (9000.0, False, 1.0)])
def test_a_429s_retry_after_cools_the_endpoint_only_while_no_pace_is_known(
    pace: float | None, cooled: bool, hold_off: float
) -> None:
    """Without a pace the endpoint cools for the retry-after (nothing else is known);
    under one the 429 corrects the pace and only the refused call waits its retry-after
    (one endpoint: nowhere else to go)."""
    e, waited = _a_429(100.0, rpm=pace, sent=[100.0], wait_s=1.0)
    assert (e.cool_until > 100.0, waited) == (cooled, hold_off)


@pytest.mark.parametrize(("declared", "cooled"), [(None, True), ("1200", False)])
def test_an_answer_from_an_exhausted_window_cools_the_endpoint_only_while_no_pace_is_known(
    declared: str | None, cooled: bool
) -> None:
    """Calls paced exactly at a quota find its window at 0 after nearly every call: cooling
    on each such answer made the calls go in bursts (a cooling's worth of turns at once)
    that the quota refused. Under a pace the pace is the answer; without one, the cooling."""
    headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1s"}
    if declared is not None:
        headers["x-ratelimit-limit-requests"] = declared

    async def run() -> Endpoint:
        fleet = Fleet([EndpointConfig("http://judge-0/v1")], clock=lambda: 100.0)
        e = fleet.endpoints[0]
        lease = fleet._lease(e, probe=False)
        fleet.answered(lease, 0.2, rates.read_headers(headers, 200))
        fleet.release(lease)
        await asyncio.sleep(0)
        return e

    e = aio.run(run())
    assert (e.cool_until == pytest.approx(101.0), e.record.rpm) == (
        cooled,
        None if declared is None else float(declared),
    )


@pytest.mark.parametrize(("pace", "deferred_to"), [(None, None), (1200.0, 100.0 + 0.05 + rates.BURST_S)])
def test_a_429_under_a_pace_holds_the_schedule_one_turn(pace: float | None, deferred_to: float | None) -> None:
    """1,200 a minute is a turn every 0.05 s: after a 429 at t=100 the schedule's next call
    starts at 100.05 (its burst spent). Without a pace there is no schedule to hold."""

    async def run() -> float | None:
        fleet = Fleet([EndpointConfig("http://judge-0/v1")], clock=lambda: 100.0)
        store = fleet.store
        assert isinstance(store, MemoryStore)
        store._clock = lambda: 100.0
        e = fleet.endpoints[0]
        e.record = dataclasses.replace(e.record, rpm=pace)
        lease = fleet._lease(e, probe=False)
        await fleet.refused(lease)
        fleet.release(lease)
        return store._schedules.get(f"{e.url}:rpm")

    assert aio.run(run()) == (None if deferred_to is None else pytest.approx(deferred_to))


def test_a_process_scales_the_rate_it_saw_by_its_part_of_the_demand() -> None:
    # two workers share one schedule; one holding 40% of the demand saw 3,600 rpm accepted
    assert rates.fleet_rpm(3600.0, 0.4) == pytest.approx(9000.0)
    assert rates.fleet_rpm(3600.0, 1.0) == 3600.0  # embedded: one process sends everything
    assert rates.fleet_rpm(3600.0, 0.0) == pytest.approx(3600.0 / rates.MIN_FRACTION)
