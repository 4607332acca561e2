"""Drift over a run (docs/method.md, "Drift over a run"): one test per rule, every
expected value worked out by hand from the rule in the test's comment."""

from __future__ import annotations

from fractions import Fraction

import pytest

from drcredit.domain.drift import (
    DEFAULT_DRIFT_THRESHOLD,
    level_counts,
    pooled,
    run_drift,
    shares,
    total_variation,
    validate_threshold,
)


def test_distribution_is_the_share_of_each_level() -> None:
    # Levels 0, 0, 1, 2, 2, 2 (visit, categories 0..2): counts 2, 1, 3 -> shares 2/6, 1/6, 3/6.
    counts = level_counts([(0, 2), (1, 1), (2, 3)], 2)
    assert counts == (2, 1, 3)
    assert shares(counts) == (2 / 6, 1 / 6, 3 / 6)
    # Report rubric scores 0..4: a score of 4 only -> (0, 0, 0, 0, 1).
    assert shares(level_counts([(4, 5)], 4)) == (0.0, 0.0, 0.0, 0.0, 1.0)
    # No judgment: no distribution.
    assert shares(level_counts([], 2)) is None


def test_a_level_outside_the_categories_is_refused() -> None:
    with pytest.raises(ValueError, match=r"level 3 is outside the categories 0\.\.2"):
        level_counts([(3, 1)], 2)


def test_first_three_steps_are_pooled_by_judgment_not_averaged() -> None:
    # Step 1: 1 judgment at level 0; step 2: 3 at level 2; step 3: none.
    # Pooled: counts (1, 0, 3) -> shares 1/4, 0, 3/4 (an average of the steps' shares
    # would give (1 + 0) / 2 = 1/2 for level 0 instead).
    assert pooled([(1, 0, 0), (0, 0, 3), (0, 0, 0)]) == (1, 0, 3)
    assert shares(pooled([(1, 0, 0), (0, 0, 3), (0, 0, 0)])) == (0.25, 0.0, 0.75)


def test_total_variation_distance_is_half_the_l1_distance() -> None:
    # p = (1/2, 1/2, 0), q = (1/4, 1/4, 1/2): 0.5 * (1/4 + 1/4 + 1/2) = 1/2.
    assert total_variation((2, 2, 0), (1, 1, 2)) == Fraction(1, 2)
    # Same distribution at different sizes: 0.
    assert total_variation((1, 2, 3), (2, 4, 6)) == 0
    # Disjoint supports: 1.
    assert total_variation((5, 0, 0), (0, 0, 7)) == 1
    # Nothing on one side: undefined.
    assert total_variation((0, 0, 0), (1, 1, 1)) is None
    with pytest.raises(ValueError):
        total_variation((1, 1), (1, 1, 1))


def test_drift_is_null_for_the_first_three_steps_and_measured_from_their_pool() -> None:
    steps = [(4, 0, 0), (0, 4, 0), (0, 0, 4), (0, 0, 6), (2, 2, 2)]
    # Baseline: (4, 4, 4) -> 1/3 each.
    # Step 4: (0, 0, 1): 0.5 * (1/3 + 1/3 + 2/3) = 2/3.
    # Step 5: (1/3, 1/3, 1/3): 0.
    got = run_drift(steps)
    assert [d.drift for d in got[:3]] == [None, None, None]
    assert [d.flagged for d in got[:3]] == [False, False, False]
    assert got[3].drift == pytest.approx(2 / 3, abs=1e-15)
    assert got[4].drift == 0.0


def test_flagged_only_when_drift_is_strictly_above_the_threshold() -> None:
    # Baseline (pooled): counts (20, 0, 0) + (0, 0, 0) + (0, 0, 0) -> level 0 only.
    base = [(20, 0, 0), (0, 0, 0), (0, 0, 0)]
    # A step with 3 of 20 at level 1: drift 0.5 * (3/20 + 3/20) = 3/20 = 0.15 exactly,
    # which is not above 0.15 (in floats 1 - 17/20 is 0.15000000000000002).
    at = run_drift([*base, (17, 3, 0)], 0.15)[3]
    assert at.drift == pytest.approx(0.15) and at.flagged is False
    # 4 of 20: 0.2 > 0.15.
    above = run_drift([*base, (16, 4, 0)], 0.15)[3]
    assert above.drift == pytest.approx(0.2) and above.flagged is True
    # The same step under a threshold of 0.2: equal, not flagged; under 0.1999: flagged.
    assert run_drift([*base, (16, 4, 0)], 0.2)[3].flagged is False
    assert run_drift([*base, (16, 4, 0)], 0.1999)[3].flagged is True
    assert DEFAULT_DRIFT_THRESHOLD == 0.15


def test_a_run_with_fewer_than_four_steps_has_no_drift() -> None:
    # Three steps are the baseline itself: nothing to compare with it.
    for n in range(4):
        got = run_drift([(n + 1, 0, 5)] * n)
        assert len(got) == n
        assert all(d.drift is None and not d.flagged for d in got)


def test_a_step_or_baseline_without_judgments_has_null_drift() -> None:
    # Step 4 without a judgment: null, not flagged.
    assert run_drift([(1, 0, 0), (1, 0, 0), (1, 0, 0), (0, 0, 0)])[3].drift is None
    # A baseline without a judgment (e.g. no rubric scores in the first steps): null.
    got = run_drift([(0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 9)])[3]
    assert got.drift is None and got.flagged is False


def test_threshold_outside_zero_one_is_refused() -> None:
    assert validate_threshold(0.0) == 0.0 and validate_threshold(1.0) == 1.0
    for bad in (-0.01, 1.5, float("nan")):
        with pytest.raises(ValueError, match="drift_threshold must be between 0 and 1"):
            validate_threshold(bad)


def test_the_worked_example_of_the_method_docs() -> None:
    # docs/method.md, "Drift over a run": visit counts per step; the baseline adds steps
    # 1-3 into (24, 12, 4) of 40 -> (0.6, 0.3, 0.1). Step 4 (0.4, 0.4, 0.2): 0.5 x 0.4 = 0.2,
    # flagged; step 5 (0.45, 0.3, 0.25): 0.5 x (0.15 + 0 + 0.15) = 0.15, equal, not flagged.
    steps = [(6, 3, 1), (13, 5, 2), (5, 4, 1), (8, 8, 4), (9, 6, 5)]
    assert pooled(steps[:3]) == (24, 12, 4)
    got = run_drift(steps)
    assert got[3].drift == pytest.approx(0.2) and got[3].flagged
    assert got[4].drift == pytest.approx(0.15) and not got[4].flagged
