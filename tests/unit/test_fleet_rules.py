"""The judge fleet's pure rules, one test per rule, values worked by hand.

Endpoints as configured, the learned limit (slow start, additive increase, cuts once
per round, caps), latency inflation, rate pacing (GCRA reservations and refunds), what
rate-limit headers say, the rate inferred from 429s, an endpoint's own breaker, where
a call goes, the demand split between processes and the pace of new connections.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from drcredit.judges.fleet import latency, limits, rates, transport
from drcredit.judges.fleet.endpoints import DEFAULT_BASE_URL, EndpointConfig, parse_endpoints
from drcredit.judges.fleet.health import ALIVE_WINDOW_S, FAILURES_TO_OPEN, PROBE_INITIAL_S, EndpointHealth
from drcredit.judges.fleet.latency import LatencyWatch
from drcredit.judges.fleet.limits import LimitState
from drcredit.judges.fleet.router import Fleet
from drcredit.judges.fleet.state import Endpoint
from drcredit.judges.fleet.store import EndpointRecord, ProcessReport, demand_share
from drcredit.judges.fleet.transport import PACE_CUT, ConnectPacer
from tests.support import aio

# ----------------------------------------------------------------------------- endpoints


def test_a_comma_separated_list_is_several_endpoints() -> None:
    got = parse_endpoints(" http://a:8000/v1/ , https://b.example/v1")
    assert [e.url for e in got] == ["http://a:8000/v1", "https://b.example/v1"]
    assert all(e.api_key is None and e.weight == 1.0 for e in got)
    assert got[0].chat_url == "http://a:8000/v1/chat/completions"


def test_no_endpoint_means_the_openai_api() -> None:
    assert parse_endpoints(None) == (EndpointConfig(DEFAULT_BASE_URL),)


def test_the_json_form_gives_keys_weights_and_caps_per_endpoint() -> None:
    got = parse_endpoints(
        '[{"url": "http://a/v1", "weight": 2, "max_concurrency": 8, "context_tokens": 4096},'
        ' {"url": "http://b/v1", "api_key": "sk-b"}, "http://c/v1"]'
    )
    assert got == (
        EndpointConfig("http://a/v1", None, 2.0, 8, 4096),
        EndpointConfig("http://b/v1", "sk-b"),
        EndpointConfig("http://c/v1"),
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("http://a/v1,,http://b/v1", "an empty entry"),
        ("ftp://a/v1", r"DRCREDIT_JUDGE_BASE_URL\[0\]: 'ftp://a/v1' is not an http\(s\) URL"),
        ("http://a/v1,http://a/v1/", "listed twice"),
        ('[{"url": "http://a/v1", "wieght": 2}]', r"\[0\]: unknown field 'wieght'"),
        ('[{"url": "http://a/v1", "weight": 0}]', r"\[0\]\.weight: expected a number above 0, got 0"),
        ('[{"url": "http://a/v1", "max_concurrency": 1.5}]', r"\[0\]\.max_concurrency: expected an integer"),
        ('[{"weight": 1}]', r"\[0\]\.url: missing"),
        ("[]", "non-empty JSON list"),
        ("[{", "not valid JSON"),
    ],
)
def test_a_mistake_in_the_endpoints_names_the_entry_and_field(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_endpoints(value)


# ----------------------------------------------------------------------------- the learned limit


def test_slow_start_adds_three_calls_per_answer_until_the_first_push_back() -> None:
    state = LimitState(limit=32)
    assert limits.grow(state, 32).limit == 128  # a round of 32 answers: fourfold


def test_past_slow_start_the_limit_grows_by_the_probe_gain_per_round() -> None:
    state = LimitState(limit=100, ssthresh=100)
    # 100 answers (one round at 100 in flight): + PROBE_GAIN * 100 / 100
    assert limits.grow(state, 100).limit == pytest.approx(100 + limits.PROBE_GAIN)


def test_slow_start_stops_at_its_threshold_and_continues_additively() -> None:
    state = LimitState(limit=90, ssthresh=100)
    # 10/3 answers reach the threshold (3 calls each); the other 50/3 add 4 * (50/3) / 100
    grown = limits.grow(state, 20)
    assert grown.limit == pytest.approx(100 + limits.PROBE_GAIN * (50 / 3) / 100)


def test_a_push_back_cuts_the_limit_once_per_round() -> None:
    state = LimitState(limit=100, epoch=3)
    cut = limits.cut(state, 3, limits.ERROR_CUT)
    assert (cut.limit, cut.ssthresh, cut.epoch) == (70, 70, 4)
    # A call sent before that cut pushes back too: the round was read already.
    assert limits.cut(cut, 3, limits.ERROR_CUT) == cut
    assert limits.cut(cut, 4, limits.ERROR_CUT).limit == pytest.approx(49)


def test_an_endpoint_back_from_an_outage_resumes_slow_start_in_a_new_round() -> None:
    state = limits.cut(limits.cut(LimitState(limit=300.0), 0, 0.7), 1, 0.7)  # 147, past slow start
    back = limits.relearned(state)
    assert (back.limit, back.ssthresh, back.epoch) == (147.0, math.inf, 3)
    assert limits.grow(back, 10).limit == 177.0  # three more per answer again
    assert limits.cut(back, 2, 0.7) == back  # a call sent during the outage cuts nothing


def test_an_endpoint_back_from_an_outage_gets_the_limit_it_had_when_it_last_answered() -> None:
    # Its calls failing to connect cut it to the floor before it was taken out.
    state = LimitState(limit=1.0, ssthresh=1.0, epoch=9)
    assert limits.relearned(state, before=3600.0).limit == 3600.0
    # Never answered in this process: at least what an unknown endpoint gets.
    assert limits.relearned(state).limit == limits.INITIAL_LIMIT
    # Within its cap all the same.
    assert limits.relearned(dataclasses.replace(state, cap=8.0), before=3600.0).limit == 8.0


def test_the_limit_never_falls_below_one_nor_rises_above_its_cap() -> None:
    assert limits.cut(LimitState(limit=1.2), 0, 0.5).limit == limits.MIN_LIMIT
    capped = limits.capped(LimitState(limit=32), 4)
    assert capped.limit == 4 and limits.grow(capped, 50).limit == 4
    assert limits.capped(capped, None).limit == 4  # lifting the cap does not grow it


def test_latency_is_inflated_when_the_recent_median_passes_its_base_by_the_inflation() -> None:
    watch = LatencyWatch()
    verdicts = [watch.observe(1.0) for _ in range(latency.RECENT)]
    assert verdicts[:-1] == [None] * (latency.RECENT - 1) and verdicts[-1] is not None
    assert watch.base == 1.0
    # Calls queue in the server: each answer takes longer; the median of the last 16
    # (their 9th smallest) passes 2x the base with the 8th slow answer.
    late = [v is not None and v.ratio > limits.INFLATION for v in (watch.observe(2.5) for _ in range(latency.RECENT))]
    assert late.index(True) == latency.RECENT // 2 - 1


def test_a_uniformly_slow_server_is_not_inflated() -> None:
    watch = LatencyWatch()
    verdicts = [watch.observe(5.0) for _ in range(3 * latency.RECENT)]
    assert all(v is None or v.ratio == 1.0 for v in verdicts)


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


def test_a_process_scales_the_rate_it_saw_by_its_part_of_the_demand() -> None:
    # two workers share one schedule; one holding 40% of the demand saw 3,600 rpm accepted
    assert rates.fleet_rpm(3600.0, 0.4) == pytest.approx(9000.0)
    assert rates.fleet_rpm(3600.0, 1.0) == 3600.0  # embedded: one process sends everything
    assert rates.fleet_rpm(3600.0, 0.0) == pytest.approx(3600.0 / rates.MIN_FRACTION)


# ----------------------------------------------------------------------------- an endpoint's breaker


def test_an_endpoint_leaves_the_rotation_after_consecutive_failures_and_a_failed_check_and_probes_back() -> None:
    health = EndpointHealth()
    for _ in range(FAILURES_TO_OPEN):
        assert not health.failed("refused", now=0.0, probe=False, connection=True)
    assert health.up and health.check_wanted()  # the failures ask for a health check
    assert not health.check_wanted()  # once
    assert health.failed("refused", now=0.1, probe=True) and not health.up  # the check failed too
    assert not health.probe_due(0.1) and health.probe_due(0.1 + PROBE_INITIAL_S)
    health.start_probe()
    assert not health.probe_due(10.0)  # one probe at a time
    assert not health.failed("refused", now=1.0, probe=True)
    assert health.next_probe == 1.0 + 2 * PROBE_INITIAL_S  # the interval doubles
    assert health.answered(1.5) and health.up and health.failures == 0


def test_an_endpoint_whose_check_answers_stays_in_the_rotation() -> None:
    # a few keep-alive connections the server had closed fail in a row: the check answers
    health = EndpointHealth()
    for _ in range(FAILURES_TO_OPEN):
        health.failed("Can not write request body", now=0.0, probe=False, connection=True)
    assert health.check_wanted()
    assert not health.failed("Can not write request body", now=0.05, probe=False, connection=True)  # checking
    assert not health.answered(0.1) and health.up and health.failures == 0
    assert not health.check_wanted()


def test_an_answer_between_failures_resets_the_count() -> None:
    health = EndpointHealth()
    health.failed("x", 0.0, probe=False)
    health.failed("x", 0.0, probe=False)
    health.answered(0.0)
    assert not health.failed("x", 0.0, probe=False) and health.up


def test_an_endpoint_that_answered_a_moment_ago_stays_in_the_rotation() -> None:
    # its connections time out in a flooded accept queue while other calls get answers:
    # push-back for its limit, not an outage
    health = EndpointHealth()
    health.answered(10.0)
    for _ in range(FAILURES_TO_OPEN + 5):
        assert not health.failed("connect timeout", 10.0 + ALIVE_WINDOW_S - 0.01, probe=False)
    assert health.up
    # no answer for the whole window: out at the next failure
    assert health.failed("connect timeout", 10.0 + ALIVE_WINDOW_S, probe=False) and not health.up


def test_failed_answers_take_an_endpoint_out_without_a_check() -> None:
    # 5xx and timeouts come from a server a health check would reach: it cannot clear them
    health = EndpointHealth()
    for _ in range(FAILURES_TO_OPEN - 1):
        assert not health.failed("500", now=0.0, probe=False)
    assert health.failed("500", now=0.0, probe=False) and not health.up


@pytest.mark.parametrize(("check", "stays_up"), [(None, True), ("connection refused", False)])
def test_connection_failures_leave_the_rotation_only_when_the_health_check_fails_too(
    check: str | None, stays_up: bool
) -> None:
    checked: list[str] = []

    async def prober(config: EndpointConfig) -> str | None:
        checked.append(config.url)
        return check

    async def run() -> bool:
        fleet = Fleet([EndpointConfig("http://judge-0/v1")], prober=prober)
        for _ in range(FAILURES_TO_OPEN):
            lease = fleet._place(frozenset(), False)
            assert lease is not None
            fleet.failed(lease, "connection", "Can not write request body")
            fleet.release(lease)
        await asyncio.sleep(0.01)  # the check runs in the background
        return fleet.endpoints[0].health.up

    assert aio.run(run()) is stays_up
    assert checked == ["http://judge-0/v1"]


def start_a_health_check(fleet: Fleet) -> None:
    """Connection failures in a row: the fleet starts a health check in the background."""
    for _ in range(FAILURES_TO_OPEN):
        lease = fleet._place(frozenset(), False)
        assert lease is not None
        fleet.failed(lease, "connection", "Can not write request body")
        fleet.release(lease)


def test_closing_the_fleet_stops_a_health_check_in_flight(caplog: pytest.LogCaptureFixture) -> None:
    """A check still waiting on its endpoint when the fleet closes is cancelled before
    close returns: it neither goes on nor logs the endpoint out of the rotation after
    its owner is gone."""
    ended: list[str] = []

    async def prober(config: EndpointConfig) -> str | None:
        try:
            await asyncio.sleep(0.3)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        ended.append("answered")
        return "connection refused"

    async def run() -> set[asyncio.Task[object]]:
        fleet = Fleet([EndpointConfig("http://judge-0/v1")], prober=prober)
        start_a_health_check(fleet)
        await asyncio.sleep(0.01)  # the check is waiting on its endpoint
        await fleet.aclose()
        left = asyncio.all_tasks() - {asyncio.current_task()}
        await asyncio.sleep(0.5)  # past the time the check would have answered
        return {t for t in left if not t.done()}

    with caplog.at_level("WARNING", logger="drcredit.judges.fleet"):
        assert aio.run(run()) == set()
    assert ended == ["cancelled"]
    assert not [r for r in caplog.records if "out of the rotation" in r.getMessage()]


def test_late_answers_cut_the_limit_only_while_the_endpoint_is_busy() -> None:
    """Answers slowed while far fewer calls are out than the limit allows are not the
    limit's doing: they leave it alone; late answers with the limit's share in flight
    set it to the slots they imply, with the headroom."""

    def limit_after(late_in_flight: int) -> float:
        async def run() -> float:
            fleet = Fleet([EndpointConfig("http://judge-0/v1")])
            e = fleet.endpoints[0]
            e.record = dataclasses.replace(e.record, limit=LimitState(100.0, 100.0, 0))

            def answer(latency: float, in_flight: int) -> None:
                e.in_flight = in_flight - 1
                lease = fleet._lease(e, probe=False)  # sent with in_flight out, itself included
                fleet.answered(lease, latency)

            for _ in range(latency.RECENT):
                answer(1.0, 10)  # the base: 1 s
            for _ in range(latency.RECENT // 2):
                answer(3.0, late_in_flight)
            return e.record.limit.limit

        return aio.run(run())

    assert limit_after(10) == 100.0  # 10 of 100 out: not the limit's doing
    # With 60 out, the 8th late answer makes the median late (3 s over a 1 s base). The
    # slots each recent answer implies: 8 x (10 x 1 / 1 = 10) and 8 x (60 x 1 / 3 = 20);
    # their median (the 9th smallest) is 20, and the limit 20 x HEADROOM.
    assert limit_after(60) == pytest.approx(20 * limits.HEADROOM)


# ----------------------------------------------------------------------------- routing


def _fleet(*paces: float, cap: int = 2) -> Fleet:
    """Endpoints of the given latencies, ``cap`` places each, in one process."""
    fleet = Fleet([EndpointConfig(f"http://judge-{i}/v1", max_concurrency=cap) for i in range(len(paces))])
    for e, pace in zip(fleet.endpoints, paces, strict=True):
        e.latency.ewma = pace
    return fleet


def test_a_call_goes_where_latency_times_load_over_share_is_least() -> None:
    fleet = _fleet(1.0, 1.0)
    # equal replicas: 1 x (1 + 0/2) ties (the first), then 1 x (1 + 1/2) > 1 (the second)
    placed = [fleet._place(frozenset(), False) for _ in range(4)]
    assert [lease.endpoint.url if lease else None for lease in placed] == [
        "http://judge-0/v1",
        "http://judge-1/v1",
        "http://judge-0/v1",
        "http://judge-1/v1",
    ]
    assert fleet._place(frozenset(), False) is None  # both full: wait


def test_a_slow_replica_takes_a_call_only_when_waiting_for_the_fast_one_is_longer() -> None:
    fleet = _fleet(1.0, 3.0)
    fast, slow = fleet.endpoints
    assert [fleet._place(frozenset(), False).endpoint for _ in range(2)] == [fast, fast]  # type: ignore[union-attr]
    # fast full: 1 x (1 + (2 + ahead) / 2) against the slow one's 3 x (1 + 0/2) = 3
    assert fleet._place(frozenset(), False, ahead=0) is None  # 2 < 3
    assert fleet._place(frozenset(), False, ahead=2) is None  # 3, not less than 3: a tie waits
    lease = fleet._place(frozenset(), False, ahead=3)  # 3.5 > 3
    assert lease is not None and lease.endpoint is slow


def test_a_weight_divides_an_endpoints_expected_time() -> None:
    fleet = Fleet([EndpointConfig("http://a/v1", max_concurrency=4), EndpointConfig("http://b/v1", weight=2.0)])
    a, b = fleet.endpoints
    a.latency.ewma, b.latency.ewma = 1.0, 1.5
    lease = fleet._place(frozenset(), False)
    assert lease is not None and lease.endpoint is b  # 1.5 / 2 < 1


def test_a_call_excluding_the_fast_endpoint_takes_the_slow_one() -> None:
    fleet = _fleet(1.0, 3.0)
    lease = fleet._place(frozenset({"http://judge-0/v1"}), False)
    assert lease is not None and lease.endpoint.url == "http://judge-1/v1"


# ----------------------------------------------------------------------------- sharing


def _report(process: str, demand: int, at: float = 100.0) -> ProcessReport:
    return ProcessReport(process, at, demand, {})


def test_a_limit_is_split_by_demand_between_live_processes() -> None:
    own = _report("a", 300)
    assert demand_share(own, [own, _report("b", 100)], now=100.0) == pytest.approx(0.75)


def test_with_no_demand_the_limit_is_split_evenly() -> None:
    assert demand_share(_report("a", 0), [_report("b", 0), _report("c", 0)], now=100.0) == pytest.approx(1 / 3)


def test_a_process_with_demand_gets_at_least_a_quarter_of_an_even_split() -> None:
    own = _report("a", 1)
    assert demand_share(own, [_report("b", 1000)], now=100.0) == pytest.approx(1 / 8)


def test_a_process_that_stopped_reporting_takes_no_share() -> None:
    own = _report("a", 10)
    assert demand_share(own, [_report("b", 1000, at=90.0)], now=100.0) == 1.0


def test_a_shared_record_survives_its_json_form() -> None:
    record = EndpointRecord(LimitState(40.5, math.inf, 3, 8.0), rpm=9000, rpm_inferred=True, context_tokens=2048)
    assert EndpointRecord.from_json(record.to_json()) == record
    assert EndpointRecord.from_json(None) == EndpointRecord()


# ----------------------------------------------------------------------------- new connections


def test_new_connections_are_spaced_at_the_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    pacer = ConnectPacer(rate=10.0, clock=lambda: 5.0)
    slept: list[float] = []

    async def record(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(transport.asyncio, "sleep", record)

    for _ in range(3):
        # With sleep recorded, a turn never suspends: run it without an event loop.
        with pytest.raises(StopIteration):
            pacer.turn().send(None)
    assert slept == [pytest.approx(0.1), pytest.approx(0.2)]  # the first goes at once


def test_an_unanswered_attempt_cuts_the_pace_once_per_congestion_event() -> None:
    clock = [0.25]
    pacer = ConnectPacer(rate=100.0, clock=lambda: clock[0])
    assert pacer.timed_out(started_at=0.0, timeout_s=0.25, waited_s=0.25)
    assert pacer.rate == pytest.approx(100 * PACE_CUT) and pacer.probing
    # Made before the cut: the same burst, no second cut.
    assert pacer.timed_out(started_at=0.01, timeout_s=0.25, waited_s=0.25)
    assert pacer.rate == pytest.approx(100 * PACE_CUT)
    # Made after it, at the lower pace, and still unanswered: cut again.
    clock[0] = 0.6
    assert pacer.timed_out(started_at=0.3, timeout_s=0.25, waited_s=0.3)
    assert pacer.rate == pytest.approx(100 * PACE_CUT * PACE_CUT)
    assert (pacer.attempts, pacer.unanswered, pacer.inconclusive) == (3, 3, 0)


def test_a_timeout_noticed_late_says_the_loop_was_busy_not_the_server_silent() -> None:
    pacer = ConnectPacer(rate=100.0, clock=lambda: 1.0)
    # Due after 0.25 s, noticed after 0.45 s: 0.2 s late, over half the timeout.
    assert not pacer.timed_out(started_at=0.55, timeout_s=0.25, waited_s=0.45)
    assert pacer.rate == 100.0 and not pacer.probing
    assert (pacer.unanswered, pacer.inconclusive) == (0, 1)
    # 0.1 s late is within half the timeout: the server's silence.
    assert pacer.timed_out(started_at=0.65, timeout_s=0.25, waited_s=0.35)
    assert pacer.rate == pytest.approx(100 * PACE_CUT)


def test_the_pace_doubles_per_round_until_the_first_unanswered_attempt() -> None:
    pacer = ConnectPacer(rate=100.0)
    for _ in range(100):
        pacer.answered(0.001)
    assert pacer.rate == 200.0
    assert pacer.try_timeout_s() == pytest.approx(0.25)  # 4 x 1 ms, at least the floor
