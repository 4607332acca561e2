"""The judge fleet's pure rules, one test per rule, values worked by hand.

Endpoints as configured, the learned limit (slow start, additive increase, cuts once
per round, caps), latency inflation, where a call goes, the demand split between
processes and the pace of new connections. Rate pacing is in ``test_fleet_pacing.py``,
an endpoint's own breaker in ``test_fleet_breaker.py``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from drcredit.judges.fleet import latency, limits, transport
from drcredit.judges.fleet.endpoints import DEFAULT_BASE_URL, EndpointConfig, parse_endpoints
from drcredit.judges.fleet.latency import LatencyWatch
from drcredit.judges.fleet.limits import LimitState
from drcredit.judges.fleet.router import Fleet
from drcredit.judges.fleet.store import EndpointRecord, ProcessReport, demand_share
from drcredit.judges.fleet.transport import PACE_CUT, ConnectPacer

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
