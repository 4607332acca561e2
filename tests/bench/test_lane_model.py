"""The lane model (``bench.lane_model``) on steps small enough to work out by hand.

Tokens cost 0.01 s each to prefill and a call's latency is 1 s, so a visit of 10 page
tokens takes 0.1 s of its replica's lane. Chain Y has three visits of 10 tokens, Z and W
one visit each, of 110 and 60 tokens; one rubric each, no tail. At 0 s the three first
calls go out most-calls-left first (Y, then Z, then W in the order given).
"""

from __future__ import annotations

import pytest
from bench.lane_model import Chain, Lanes

Y, Z, W = Chain((10, 10, 10), 1), Chain((110,), 1), Chain((60,), 1)


def step(policy: str, chains: list[Chain], replicas: int = 1, cap: int | None = None) -> tuple[float, float]:
    return Lanes(chains, replicas, policy, cap, prefill_s_per_token=0.01, tail_tokens=0, latency_s=1.0).run()


def test_first_come_first_served_puts_the_long_chain_behind_what_came_first() -> None:
    # Y0 [0, 0.1], Z0 [0.1, 1.2]; W0 queued at 0 goes before Y1 queued at 1.1:
    # W0 [1.2, 1.8], Y1 [1.8, 1.9] answered at 2.9, Y2 [2.9, 3.0] answered at 4.0.
    wall, bound = step("fcfs", [Y, Z, W])
    assert wall == pytest.approx(4.0)
    # The longest chain is 3 latencies; the lane's 2.0 s of prefill plus one latency is 3.0.
    assert bound == pytest.approx(3.0)


def test_a_lane_in_priority_order_serves_the_chain_with_most_calls_left_first() -> None:
    # At 1.2 W0 (1 call left) and Y1 (2 left) wait: Y1 [1.2, 1.3] answered at 2.3,
    # W0 [1.3, 1.9] answered at 2.9, Y2 [2.3, 2.4] answered at 3.4.
    wall, bound = step("priority", [Y, Z, W])
    assert (wall, bound) == (pytest.approx(3.4), pytest.approx(3.0))


def test_a_cap_holds_calls_in_the_platform_and_sends_them_most_calls_left_first() -> None:
    # One call in flight at a time: Y0, Y1, Y2 (each 0.1 s + 1 s), then Z0 at 3.3
    # answered at 5.4, then W0 at 5.4 answered at 7.0.
    wall, _ = step("cap", [Y, Z, W], cap=1)
    assert wall == pytest.approx(7.0)


def test_a_visits_rubric_calls_share_one_replica_and_its_pages_are_prefilled_once() -> None:
    # Two rubric calls of one 100-token visit, two replicas: both go where the first went;
    # the first prefills [0, 1.0], the second only its (empty) tail at 1.0: both answered at 2.0.
    wall, bound = step("fcfs", [Chain((100,), 2)], replicas=2)
    assert wall == pytest.approx(2.0)
    assert bound == pytest.approx(2.0)  # 1.0 s of prefill on the busiest replica, once, + 1 s


def test_holding_the_calls_waiting_for_their_prefill_serves_the_long_chain_first() -> None:
    # One call waiting for its prefill at a time. Y0 [0, 0.1]; then Z0 (held before W0,
    # both 1 call left) [0.1, 1.2]; Y1 ready at 1.1 waits, and at 1.2 goes before W0:
    # Y1 [1.2, 1.3] answered at 2.3, W0 [1.3, 1.9], Y2 [2.3, 2.4] answered at 3.4. The
    # calls in their latency never counted: the priority lane's 3.4, not the cap's 7.0.
    wall, bound = step("prefill", [Y, Z, W], cap=1)
    assert (wall, bound) == (pytest.approx(3.4), pytest.approx(3.0))


def test_each_process_holds_only_its_own_calls_so_anothers_call_can_queue_ahead() -> None:
    """Y and X (one visit of 100 tokens) on process 0, W on process 1; one call of each
    process waiting for its prefill at a time, one replica.

    One process: Y0 [0, 0.1]; X0 (held before W0) [0.1, 1.1]; Y1, ready at 1.1, goes
    before W0: [1.1, 1.2]; W0 [1.2, 1.8]; Y2 [2.2, 2.3], answered at 3.3.
    Two processes: process 1 sends W0 at 0, queued behind Y0: W0 [0.1, 0.7], X0 [0.7, 1.7];
    Y1, ready at 1.1, waits for process 0's X0: [1.7, 1.8]; Y2 [2.8, 2.9], answered at 3.9."""
    x, w = Chain((100,), 1), Chain((60,), 1, process=1)

    def split(processes: int) -> tuple[float, float]:
        chains = [Y, x, w]
        lanes = Lanes(
            chains, 1, "prefill", 1, prefill_s_per_token=0.01, tail_tokens=0, latency_s=1.0, processes=processes
        )
        return lanes.run()

    assert split(1) == (pytest.approx(3.3), pytest.approx(3.0))  # W (process 1) runs with the others
    assert split(2) == (pytest.approx(3.9), pytest.approx(3.0))
