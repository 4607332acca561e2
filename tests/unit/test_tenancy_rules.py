"""The tenants' rules, one test per rule, expected values worked by hand from the rule:
fair parts of the fleet (water-filling), a process's parts, the fair order of waiting
calls (start-time fair queueing), budget windows and the budget that blocks, and the
operator's settings refused with the field named."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from drcredit.domain.usage import JudgePrice, Usage
from drcredit.settings import Settings
from drcredit.tenancy.burst import BUSY_CHARGE_MAX_S, Bursts
from drcredit.tenancy.fair import FairQueue, allocate, process_parts
from drcredit.tenancy.owner import Owner
from drcredit.tenancy.policy import Burst, TenantPolicy, parse_tenants
from drcredit.tenancy.shares import Shares
from drcredit.tenancy.windows import BudgetState, blocking, bounds, bucket, held_for_budget, spent, states

# ---------------------------------------------------------------------- allocate


def test_backlogged_tenants_split_the_capacity_by_weight() -> None:
    # 64 places, weights 3:1, both want more than 64: 64 x 3/4 = 48 and 64 x 1/4 = 16.
    assert allocate({"a": 500, "b": 500}, {"a": 3, "b": 1}, {}, 64) == {"a": 48.0, "b": 16.0}


def test_a_tenant_needing_less_than_its_part_leaves_the_rest_to_the_others() -> None:
    # Equal weights: b's part would be 32 but it needs 5; a gets 64 - 5 = 59.
    assert allocate({"a": 500, "b": 5}, {}, {}, 64) == {"a": 59.0, "b": 5.0}


def test_water_filling_over_three_tenants() -> None:
    # 90 places, weights 1:1:1 -> 30 each; c needs 10: the 80 left split 40/40; b needs
    # 25: a takes the remaining 55.
    assert allocate({"a": 1000, "b": 25, "c": 10}, {}, {}, 90) == {"a": 55.0, "b": 25.0, "c": 10.0}


def test_max_share_caps_a_tenant_even_alone() -> None:
    # Alone with a cap of a quarter of 64 = 16: 16, and the other 48 stay unused.
    assert allocate({"a": 500}, {}, {"a": 16.0}, 64) == {"a": 16.0}


def test_a_capped_tenant_leaves_its_part_to_the_others() -> None:
    # Weights 1:1 -> 32/32, but a is capped at 8: b takes 56.
    assert allocate({"a": 500, "b": 500}, {}, {"a": 8.0}, 64) == {"a": 8.0, "b": 56.0}


def test_capacity_no_demand_takes_is_spread_by_weight() -> None:
    # Both need 10 of 64: 44 left over, spread 3:1 -> a 10 + 33, b 10 + 11.
    assert allocate({"a": 10, "b": 10}, {"a": 3, "b": 1}, {}, 64) == {"a": 43.0, "b": 21.0}


def test_idle_tenants_get_nothing() -> None:
    assert allocate({"a": 100, "b": 0}, {}, {}, 64) == {"a": 64.0}


# ---------------------------------------------------------------------- process parts


def test_a_process_gets_each_tenants_part_in_proportion_to_its_demand_of_it() -> None:
    # Fleet: a 610 calls (600 here), b 605 (5 here), 64 places, weights 1:1 -> 32 each.
    # Here: a 32 x 600/610, b 32 x 5/605; the fraction is their sum over 64.
    parts = process_parts({"a": 600, "b": 5}, {"a": 610, "b": 605}, {"a": 1, "b": 1}, {}, 64, 2)
    a, b = 32 * 600 / 610, 32 * 5 / 605
    assert parts.tenants == pytest.approx({"a": a, "b": b})
    assert parts.fraction == pytest.approx((a + b) / 64)
    # The other process gets the rest of both parts: together the whole limit.
    other = process_parts({"a": 10, "b": 600}, {"a": 610, "b": 605}, {"a": 1, "b": 1}, {}, 64, 2)
    assert parts.fraction + other.fraction == pytest.approx(1.0)


def test_no_demand_anywhere_splits_the_limit_evenly() -> None:
    assert process_parts({}, {}, {}, {}, 64, 4).fraction == 0.25


def test_a_capped_tenant_is_capped_in_each_process_by_its_demand_there() -> None:
    # a alone with max_share 0.5 of 64: 32 fleet-wide; this process has 3/4 of its demand:
    # part and cap 24, fraction 24/64.
    parts = process_parts({"a": 300}, {"a": 400}, {"a": 1}, {"a": 0.5}, 64, 2)
    assert parts.tenants == {"a": 24.0} and parts.caps == {"a": 24.0} and parts.fraction == 24 / 64


# ---------------------------------------------------------------------- fair order


def _drain(queue: FairQueue[str], n: int) -> list[str]:
    return [item for _ in range(n) if (item := queue.pop_first()) is not None]


def test_calls_are_placed_in_weight_proportion() -> None:
    # SFQ with a's virtual time +1/3 per call and b's +1; ties go to the name first:
    # a0 b0 -> a (a=1/3) -> b (b=1) -> a (2/3) -> a (1) -> a (tie at 1; a=4/3) -> b (2)
    # -> a (5/3) -> a (2): a b a a a b a a.
    q: FairQueue[str] = FairQueue({"a": 3.0, "b": 1.0}.__getitem__)
    for i in range(20):
        q.push(f"a{i}", Owner("a"), 0)
        q.push(f"b{i}", Owner("b"), 0)
    assert [x[0] for x in _drain(q, 8)] == list("abaaabaa")


def test_an_idle_tenant_banks_no_credit() -> None:
    # a alone for 10 calls (a's time 10, the clock at a's 9th start: 9); b arrives and
    # starts at the clock, 9: b (b=10), then a (tie, a=11), b (11), a (12)...
    q: FairQueue[str] = FairQueue()
    for i in range(14):
        q.push(f"a{i}", Owner("a"), 0)
    assert len(_drain(q, 10)) == 10
    for i in range(4):
        q.push(f"b{i}", Owner("b"), 0)
    assert [x[0] for x in _drain(q, 4)] == list("baba")


def test_training_goes_before_audits_within_a_tenant() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("audit", Owner("a", "r", audit=True), 100)
    q.push("train", Owner("a", "r"), 1)
    assert _drain(q, 2) == ["train", "audit"]


def test_runs_of_a_tenant_take_turns() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(3):
        q.push(f"long{i}", Owner("a", "long"), 10)
    q.push("short0", Owner("a", "short"), 1)
    assert _drain(q, 4) == ["long0", "short0", "long1", "long2"]


def test_within_a_run_the_longest_chain_goes_first_then_arrival() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("p1", Owner("a", "r"), 1)
    q.push("p5", Owner("a", "r"), 5)
    q.push("p5-later", Owner("a", "r"), 5)
    assert _drain(q, 3) == ["p5", "p5-later", "p1"]


def test_the_least_urgent_call_is_taken_from_the_run_whose_turn_it_is() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("a-p9", Owner("a"), 9)
    q.push("a-p1", Owner("a"), 1)
    q.push("b-p0", Owner("b"), 0)
    assert q.last() == "a-p1" and len(q) == 3  # looked at, left in place
    assert q.pop_last() == "a-p1"


def test_a_call_given_up_takes_nobodys_turn() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("a0", Owner("a"), 0)
    q.push("a1", Owner("a"), 0)
    q.push("b0", Owner("b"), 0)
    assert q.pop_first(charge=False) == "a0"
    assert q.pop_first() == "a1"  # a was not charged for a0: still first (tie, name order)


def test_skipped_tenants_are_passed_over() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("a0", Owner("a"), 0)
    q.push("b0", Owner("b"), 0)
    assert q.first(frozenset({"a"})) == "b0"


def test_a_tenant_at_its_cap_may_not_start_a_call() -> None:
    shares = Shares({"a": TenantPolicy(max_share=0.25)})
    shares.divide({"a": 100, "b": 100}, {"a": 100, "b": 100}, 64, 1)
    # a's cap: 0.25 x 64 = 16 places.
    assert shares.capped({"a": 15, "b": 40}) == frozenset()
    assert shares.capped({"a": 16, "b": 40}) == frozenset({"a"})


# ---------------------------------------------------------------------- bursts

BURSTY = {"b": TenantPolicy(weight=1, burst=Burst(weight=7, seconds=10))}


def _read(bursts: Bursts, demand: dict[str, float], start: float, end: float) -> dict[str, float]:
    """Readings every half second from ``start`` to ``end`` (as the fleet's reports)."""
    got: dict[str, float] = {}
    for i in range(round((end - start) / 0.5) + 1):
        got = bursts.weights(BURSTY, demand, start + 0.5 * i)
    return got


def test_a_tenant_that_was_idle_holds_its_burst_weight_while_its_allowance_lasts() -> None:
    bursts = Bursts()
    # b first seen with calls at t=100: the whole 10 s allowance, weight 7 (a has none: 1).
    assert bursts.weights(BURSTY, {"a": 50, "b": 20}, 100.0) == {"a": 1.0, "b": 7.0}
    # Busy from 100 to 109.5: 0.5 s left, still 7.
    assert _read(bursts, {"a": 50, "b": 20}, 100.5, 109.5) == {"a": 1.0, "b": 7.0}
    assert bursts.left("b") == pytest.approx(0.5)
    # Busy to 110: spent: its weight, 1.
    assert bursts.weights(BURSTY, {"a": 50, "b": 20}, 110.0) == {"a": 1.0, "b": 1.0}
    assert bursts.left("b") == 0.0


def test_the_allowance_comes_back_second_for_second_while_idle_up_to_its_seconds() -> None:
    bursts = Bursts()
    bursts.weights(BURSTY, {"b": 20}, 0.0)
    bursts.weights(BURSTY, {"b": 0}, 4.0)  # busy 0-4 s: 6 left; idle from now
    assert bursts.left("b") == pytest.approx(6.0)
    bursts.weights(BURSTY, {}, 7.0)  # idle 3 s (not reported at all): 6 + 3 = 9
    assert bursts.left("b") == pytest.approx(9.0)
    # Idle 100 s more: capped at 10; busy again: weight 7.
    assert bursts.weights(BURSTY, {"b": 5}, 107.0) == {"b": 7.0}
    assert bursts.left("b") == pytest.approx(10.0)


def test_a_tenant_busy_all_along_spends_its_burst_once() -> None:
    bursts = Bursts()
    got = [bursts.weights(BURSTY, {"b": 9}, float(t))["b"] for t in range(0, 40, 2)]
    # Spent at 2 s a reading: 10 left at 0, 8, 6, 4, 2, then 0 from t=10 on.
    assert got == [7.0] * 5 + [1.0] * 15


def test_a_gap_between_readings_is_charged_busy_only_up_to_its_cap() -> None:
    bursts = Bursts()
    policies = {"b": TenantPolicy(burst=Burst(weight=4, seconds=60))}
    for t in range(41):  # busy, read every second: 60 - 40 = 20 left
        bursts.weights(policies, {"b": 3}, float(t))
    assert bursts.left("b") == pytest.approx(20.0)
    # Then no reading for 30 s: busy for the first 5 of them (the cap), idle for 25.
    bursts.weights(policies, {"b": 3}, 70.0)
    assert bursts.left("b") == pytest.approx(20.0 - BUSY_CHARGE_MAX_S + (30.0 - BUSY_CHARGE_MAX_S))


def test_a_bursting_tenant_arriving_between_reports_is_ordered_at_its_burst_weight() -> None:
    # a alone in the last report, 64 places all its own (weight 1: scale 64 per unit of
    # weight); b's calls arrive before the next report: 7 x 64 in the fair order.
    shares = Shares(BURSTY, clock=lambda: 0.0)
    shares.divide({"a": 500}, {"a": 500}, 64, 1)
    assert shares.weight("b") == 7 * 64.0
    assert Shares({}, clock=lambda: 0.0).weight("b") == 1.0


def test_a_burst_weight_moves_the_fleets_parts_while_it_lasts() -> None:
    # 64 places, a weight 1, b bursting at 7: 64 x 7/8 = 56 to b, 8 to a; once b's
    # allowance is spent, 32 each.
    clock = [0.0]
    shares = Shares(BURSTY, clock=lambda: clock[0])
    shares.divide({"a": 500, "b": 500}, {"a": 500, "b": 500}, 64, 1)
    assert shares.parts is not None and shares.parts.tenants == {"a": 8.0, "b": 56.0}
    for tick in range(1, 21):  # reports every half second for 10 s
        clock[0] = tick * 0.5
        shares.divide({"a": 500, "b": 500}, {"a": 500, "b": 500}, 64, 1)
    assert shares.parts.tenants == {"a": 32.0, "b": 32.0}


# ---------------------------------------------------------------------- windows and budgets


def test_only_a_queued_row_with_a_hold_waits_for_its_budget() -> None:
    reset = datetime(2026, 11, 28, tzinfo=UTC)
    assert held_for_budget("queued", reset)
    assert not held_for_budget("queued", None)  # queued for a worker, not for a budget
    # A hold left on a row that has started or ended no longer holds it back.
    assert not any(held_for_budget(status, reset) for status in ("running", "done", "failed"))


def test_day_and_month_windows_are_utc_calendar_ones() -> None:
    now = datetime(2026, 12, 31, 23, 59, 30, tzinfo=UTC)
    assert bounds("day", now) == (datetime(2026, 12, 31, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    assert bounds("month", now) == (datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    assert bounds("month", datetime(2026, 2, 10, tzinfo=UTC))[1] == datetime(2026, 3, 1, tzinfo=UTC)


def test_test_windows_count_seconds_from_the_epoch() -> None:
    now = datetime.fromtimestamp(1_000_000_005, UTC)
    # 10 s windows: [1e9, 1e9 + 10); a month is 30 of them: [999_999_900, 1_000_000_200).
    assert bounds("day", now, 10) == (datetime.fromtimestamp(1e9, UTC), datetime.fromtimestamp(1e9 + 10, UTC))
    assert bounds("month", now, 10)[0] == datetime.fromtimestamp(999_999_900, UTC)
    assert bucket(now, 10) == datetime.fromtimestamp(1e9, UTC)
    assert bucket(datetime(2026, 5, 1, 13, 45, tzinfo=UTC)) == datetime(2026, 5, 1, 13, tzinfo=UTC)


def test_tokens_are_prompt_plus_completion_and_usd_their_price() -> None:
    used = Usage(prompt_tokens=3000, completion_tokens=200, cached_prompt_tokens=1000)
    assert spent("tokens_per_day", used, None) == 3200
    # (2,000 x 2 + 1,000 x 0.5 + 200 x 8) / 1e6
    assert spent("usd_per_month", used, JudgePrice(2, 0.5, 8)) == pytest.approx(0.0061)


def test_a_budget_is_spent_once_used_reaches_its_limit() -> None:
    policy = TenantPolicy.model_validate({"budget": {"tokens_per_day": 1000, "tokens_per_month": 5000}})
    now = datetime(2026, 3, 14, 12, tzinfo=UTC)
    usage = {"day": Usage(prompt_tokens=900, completion_tokens=100), "month": Usage(prompt_tokens=4000)}
    got = states(policy, usage, None, now)
    assert got == [
        BudgetState("tokens_per_day", 1000, 1000, datetime(2026, 3, 15, tzinfo=UTC)),
        BudgetState("tokens_per_month", 5000, 4000, datetime(2026, 4, 1, tzinfo=UTC)),
    ]
    assert [b.exhausted for b in got] == [True, False] and got[1].left == 1000
    assert blocking(got) == got[0]


def test_the_blocking_budget_is_the_one_that_resets_last() -> None:
    day = BudgetState("tokens_per_day", 10, 10, datetime(2026, 3, 15, tzinfo=UTC))
    month = BudgetState("usd_per_month", 1, 2, datetime(2026, 4, 1, tzinfo=UTC))
    assert blocking([day, month]) == month
    assert blocking([BudgetState("tokens_per_day", 10, 9, day.resets_at)]) is None


# ---------------------------------------------------------------------- settings


def test_policies_default_and_parse() -> None:
    got = parse_tenants('{"a": {"weight": 3, "on_budget": "wait"}, "b": null}', {"a", "b"})
    assert got["a"].weight == 3 and got["a"].on_budget == "wait" and got["b"] == TenantPolicy()


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ('{"a": {"weight": 0}}', "DRCREDIT_TENANTS.a.weight"),
        ('{"a": {"max_share": 1.5}}', "DRCREDIT_TENANTS.a.max_share"),
        ('{"a": {"budget": {"tokens_per_day": -1}}}', "DRCREDIT_TENANTS.a.budget.tokens_per_day"),
        ('{"a": {"budget": {"per_week": 1}}}', "DRCREDIT_TENANTS.a.budget.per_week"),
        ('{"a": {"on_budget": "later"}}', "DRCREDIT_TENANTS.a.on_budget"),
        ('{"a": {"burst": {"weight": 4}}}', "DRCREDIT_TENANTS.a.burst.seconds"),
        ('{"a": {"burst": {"weight": 0, "seconds": 30}}}', "DRCREDIT_TENANTS.a.burst.weight"),
        ('{"a": {"burst": {"weight": 4, "seconds": 30, "every": 1}}}', "DRCREDIT_TENANTS.a.burst.every"),
        ('{"a": {"weight": 2, "burst": {"weight": 2, "seconds": 30}}}', "burst.weight 2 is not above weight 2"),
        ('{"zed": {}}', "DRCREDIT_TENANTS.zed"),
        ("[1, 2]", "DRCREDIT_TENANTS"),
        ("{not json", "DRCREDIT_TENANTS"),
    ],
)
def test_bad_tenant_settings_refuse_to_start_naming_the_field(raw: str, named: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(api_keys="a:k1,b:k2", tenants=raw)
    assert named in str(caught.value)


def test_a_usd_budget_needs_a_price() -> None:
    with pytest.raises(ValidationError, match=r"DRCREDIT_TENANTS\.a\.budget\.usd_per_day.*DRCREDIT_JUDGE_PRICE"):
        Settings(api_keys="a:k1", tenants='{"a": {"budget": {"usd_per_day": 5}}}')
    assert Settings(api_keys="a:k1", tenants='{"a": {"budget": {"usd_per_day": 5}}}', judge_price="1,1,1").tenants
