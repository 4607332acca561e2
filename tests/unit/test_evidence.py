"""The evidence proxy (docs/method.md, "Evidence proxy"), one rule per test, values computed by hand."""

from __future__ import annotations

import pytest

from drcredit.domain.evidence import DEFAULT_BUDGETS, contribution, evidence_curve


def test_default_budgets_are_the_papers() -> None:
    assert DEFAULT_BUDGETS == (2, 4, 6, 8, 10, 12, 14)


def test_visit_contributes_its_uncapped_credit() -> None:
    # A visit whose credit was capped at 1.0 still contributes its uncapped 1.3.
    assert contribution("visit", 1.3, None, 0.1) == 1.3


def test_search_contributes_eta_times_matches_and_no_navigation() -> None:
    assert contribution("search", None, 3, 0.1) == pytest.approx(0.3)
    assert contribution("search", None, 3, 0.25) == pytest.approx(0.75)
    assert contribution("search", None, None, 0.1) == 0.0  # skipped or failed snippet call


def test_other_turns_are_not_research_turns() -> None:
    with pytest.raises(ValueError):
        contribution("tool", None, None, 0.1)


def test_prefix_sums_and_rates_over_rollouts() -> None:
    # A: u = 0.5, 0, 1.0 (T=3); B: u = 0.2 (T=1).
    b2, b4 = evidence_curve([[0.5, 0.0, 1.0], [0.2]], budgets=(2, 4))
    # b=2: C_A = 0.5, C_B = 0.2 -> C = 0.35; U = mean(0.5/2, 0.2/1) = 0.225
    assert (b2.cumulative, b2.rate, b2.rollouts) == (pytest.approx(0.35), pytest.approx(0.225), 2)
    # b=4: C_A = 1.5 (only 3 turns), C_B = 0.2 -> 0.85; U = mean(1.5/3, 0.2/1) = 0.35
    assert (b4.cumulative, b4.rate) == (pytest.approx(0.85), pytest.approx(0.35))


def test_rollouts_without_research_turns_are_left_out() -> None:
    (point,) = evidence_curve([[0.4, 0.4], []], budgets=(2,))
    assert (point.cumulative, point.rate, point.rollouts) == (pytest.approx(0.8), pytest.approx(0.4), 1)


def test_no_research_turn_anywhere_has_no_value() -> None:
    (point,) = evidence_curve([[], []], budgets=(2,))
    assert (point.cumulative, point.rate, point.rollouts) == (None, None, 0)


def test_budgets_must_be_positive() -> None:
    with pytest.raises(ValueError):
        evidence_curve([[1.0]], budgets=(0,))
