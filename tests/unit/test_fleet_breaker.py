"""An endpoint's own breaker, one test per rule: when it opens, how it probes, when it
rejoins the rotation."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from drcredit.judges.fleet import latency, limits
from drcredit.judges.fleet.endpoints import EndpointConfig
from drcredit.judges.fleet.health import ALIVE_WINDOW_S, FAILURES_TO_OPEN, PROBE_INITIAL_S, EndpointHealth
from drcredit.judges.fleet.limits import LimitState
from drcredit.judges.fleet.router import Fleet
from tests.support import aio
from tests.support.fleet import start_a_health_check

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
        start_a_health_check(fleet)
        await asyncio.sleep(0.01)  # the check runs in the background
        return fleet.endpoints[0].health.up

    assert aio.run(run()) is stays_up
    assert checked == ["http://judge-0/v1"]


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
