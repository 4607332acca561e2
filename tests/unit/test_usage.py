"""Judge usage sums and their cost, worked out by hand; the price setting's checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from drcredit.domain.usage import JudgePrice, Usage, mean_of, parse_price, per_item, total
from drcredit.settings import Settings


def test_cost_prices_uncached_cached_and_completion_tokens_apart() -> None:
    usage = Usage(calls=3, judgments=2, prompt_tokens=10_000, completion_tokens=500, cached_prompt_tokens=4_000)
    price = JudgePrice(input=0.15, cached=0.075, output=0.6)
    # 6,000 uncached x 0.15 + 4,000 cached x 0.075 + 500 x 0.6 = 900 + 300 + 300 per million
    assert usage.cost_usd(price) == pytest.approx(0.0015)
    assert usage.cost_usd(None) is None
    assert usage.document(price) == {
        "calls": 3,
        "judgments": 2,
        "prompt_tokens": 10_000,
        "completion_tokens": 500,
        "cached_prompt_tokens": 4_000,
        "estimated_prompt_tokens": 0,
        "reused": 0,
        "cached_prompt_share": 0.4,  # 4,000 / 10,000
        "cost_usd": pytest.approx(0.0015),
    }


def test_a_server_reporting_more_cached_than_prompt_tokens_is_not_paid_back() -> None:
    usage = Usage(prompt_tokens=100, cached_prompt_tokens=150)
    assert usage.cost_usd(JudgePrice(1.0, 0.5, 2.0)) == pytest.approx(100 * 0.5 / 1e6)


def test_sums_per_item_and_means_over_steps() -> None:
    a = Usage(1, 1, 100, 10, 40, 0)
    b = Usage(3, 2, 300, 30, 0, 50)
    assert total([a, b]) == a + b == Usage(4, 3, 400, 40, 40, 50)
    price = JudgePrice(2.0, 1.0, 4.0)
    step = per_item(a + b, 2, price)
    # (360 x 2 + 40 x 1 + 40 x 4) / 1e6 = 920e-6, over 2 trajectories
    assert step == {
        "calls": 2.0,
        "judgments": 1.5,
        "prompt_tokens": 200.0,
        "completion_tokens": 20.0,
        "cached_prompt_tokens": 20.0,
        "estimated_prompt_tokens": 25.0,
        "reused": 0.0,
        "cached_prompt_share": 0.1,  # 40 / 400: the sums' ratio, not divided by trajectories
        "cost_usd": pytest.approx(460e-6),
    }
    assert per_item(a, 0, price) is None
    other = per_item(a, 1, price)
    assert other is not None
    means = mean_of([step, None, other])
    assert means is not None and means["calls"] == 1.5 and means["prompt_tokens"] == 150.0
    # (60 x 2 + 40 x 1 + 10 x 4) / 1e6 = 200e-6 for a alone; mean with 460e-6
    assert means["cost_usd"] == pytest.approx(330e-6)
    assert mean_of([per_item(a, 1, None)])["cost_usd"] is None  # type: ignore[index]
    assert mean_of([None]) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.15,0.075,0.6", JudgePrice(0.15, 0.075, 0.6)), (" 1 , 0 , 2.5 ", JudgePrice(1.0, 0.0, 2.5))],
)
def test_a_price_is_three_numbers(text: str, expected: JudgePrice) -> None:
    assert parse_price(text) == expected
    assert Settings(judge_price=text).judge_price == expected


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("0.15,0.6", "expected three numbers 'in,cached,out'"),
        ("1,2,3,4", "expected three numbers"),
        ("0.15,-1,0.6", "the cached price must be a non-negative number, got '-1'"),
        ("free,0,0", "the in price must be a non-negative number, got 'free'"),
        ("1,1,nan", "the out price must be a non-negative number, got 'nan'"),
        ("1,1,inf", "the out price"),
    ],
)
def test_a_bad_price_names_the_setting_and_the_part(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match="DRCREDIT_JUDGE_PRICE") as raised:
        parse_price(text)
    assert needle in str(raised.value)
    with pytest.raises(ValidationError, match="DRCREDIT_JUDGE_PRICE"):
        Settings(judge_price=text)


def test_no_price_is_no_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRCREDIT_JUDGE_PRICE", raising=False)
    assert Settings().judge_price is None
    monkeypatch.setenv("DRCREDIT_JUDGE_PRICE", "")
    assert Settings().judge_price is None
    monkeypatch.setenv("DRCREDIT_JUDGE_PRICE", "3,1.5,15")
    assert Settings().judge_price == JudgePrice(3.0, 1.5, 15.0)


def test_reused_judgments_add_no_tokens_and_the_cached_share_is_of_the_sums() -> None:
    # Two rollouts: one asked the judge (1,000 prompt tokens, 750 from the server's cache),
    # one answered both its judgments from the tenant's store (no call, no tokens).
    asked = Usage(calls=2, judgments=2, prompt_tokens=1_000, completion_tokens=60, cached_prompt_tokens=750)
    from_store = Usage(reused=2)
    group = total([asked, from_store])
    doc = group.document(JudgePrice(1.0, 0.1, 2.0))
    assert doc["reused"] == 2 and doc["calls"] == 2 and doc["prompt_tokens"] == 1_000
    assert doc["cached_prompt_share"] == 0.75  # 750 / 1,000
    # 250 uncached x 1.0 + 750 cached x 0.1 + 60 x 2.0 = 250 + 75 + 120 per million
    assert doc["cost_usd"] == pytest.approx(445e-6)
    assert from_store.document(None)["cached_prompt_share"] is None  # no prompt tokens: no share
    assert from_store.document(JudgePrice(1.0, 0.1, 2.0))["cost_usd"] == 0.0


def test_what_is_left_to_count_is_the_total_less_what_was_counted() -> None:
    total = Usage(calls=5, judgments=4, prompt_tokens=900, completion_tokens=90, cached_prompt_tokens=300)
    counted = Usage(calls=3, judgments=3, prompt_tokens=600, completion_tokens=60, cached_prompt_tokens=100)
    assert total - counted == Usage(
        calls=2, judgments=1, prompt_tokens=300, completion_tokens=30, cached_prompt_tokens=200
    )
    assert counted + (total - counted) == total


def test_an_audits_spend_sums_each_answered_judgments_attempts() -> None:
    """Two judgments: one answered at its second attempt (a 429, then 120 prompt tokens,
    40 of them cached, and 12 completion tokens), one at its first (80 and 8): 3 calls,
    2 judgments, 200 prompt, 40 cached and 20 completion tokens."""
    from drcredit.audit.spend import AuditSpend, attempts_usage

    retried = [
        {"outcome": "rate_limited", "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0},
        {"outcome": "ok", "prompt_tokens": 120, "completion_tokens": 12, "cached_tokens": 40},
    ]
    first = [{"outcome": "ok", "prompt_tokens": 80, "completion_tokens": 8, "cached_tokens": None}]
    assert attempts_usage(retried) == Usage(calls=2, prompt_tokens=120, completion_tokens=12, cached_prompt_tokens=40)
    spend = AuditSpend()
    assert spend.total() == Usage()
    spend.add(retried)
    spend.add(first)
    assert spend.total() == Usage(
        calls=3, judgments=2, prompt_tokens=200, completion_tokens=20, cached_prompt_tokens=40
    )
