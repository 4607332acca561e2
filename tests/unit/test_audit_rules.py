"""The judge audit's rules (docs/method.md, "Judge audit"), one test per rule, worked by hand.

Kappa on small confusion matrices (perfect, chance, opposite, undefined, a weighted one,
Cohen's), then the pairing rules: which keys pair, which are left out, the first visits,
snippet matches per rubric, report rubrics, citations by claim, kinds without pairs, and
the effect on the training signal and the outcome rewards.
"""

from __future__ import annotations

import math

import pytest

from drcredit.audit.report import Compared, Side, build_report, pair_judgments
from drcredit.domain.advantages import GroupAdvantages, GroupStats, RolloutAdvantages, TurnAdvantage
from drcredit.domain.agreement import agreement, confusion_matrix, effect, rmse, weighted_kappa

# ----------------------------------------------------------------------------- kappa


def test_perfect_agreement_has_kappa_one() -> None:
    got = agreement([(0, 0), (1, 1), (2, 2), (2, 2)], 2)
    assert (got.exact, got.kappa) == (1.0, 1.0)
    assert got.confusion == [[1, 0, 0], [0, 1, 0], [0, 0, 2]]


def test_agreement_at_chance_has_kappa_zero() -> None:
    # Each judge half 0s, half 1s, independently: O equals E in every cell.
    got = agreement([(0, 0), (0, 1), (1, 0), (1, 1)], 1)
    assert got.exact == 0.5 and got.kappa == pytest.approx(0.0)


def test_opposite_judges_have_kappa_minus_one() -> None:
    got = agreement([(0, 1), (1, 0)], 1)
    assert got.exact == 0.0 and got.kappa == pytest.approx(-1.0)


def test_kappa_is_undefined_when_chance_could_not_disagree() -> None:
    # Both judges always said 0: sum(w * E) = 0.
    assert agreement([(0, 0), (0, 0), (0, 0)], 2).kappa is None
    assert weighted_kappa([[0, 0], [0, 0]]) is None  # no pair at all


def test_two_judges_each_constant_but_different_have_kappa_zero() -> None:
    # Original always 2, audit always 0: O = E = the one cell (2, 0), w = 1.
    assert agreement([(2, 0), (2, 0)], 2).kappa == pytest.approx(0.0)


def test_quadratic_weights_worked_by_hand() -> None:
    # n = 5; rows (0.4, 0.2, 0.4), columns (0.2, 0.6, 0.2); w = (i - j)^2 / 4.
    # sum(w * O) = 0.25 * (0.2 + 0.2) = 0.1; sum(w * E) = 0.14 + 0.02 + 0.14 = 0.30.
    got = agreement([(0, 0), (0, 1), (1, 1), (2, 1), (2, 2)], 2)
    assert got.exact == pytest.approx(0.6)
    assert got.kappa == pytest.approx(1 - 0.1 / 0.3)


def test_two_categories_give_cohens_kappa() -> None:
    # 20 (1,1), 5 (1,0), 10 (0,1), 15 (0,0): p_o = 0.7, p_e = 0.5 x 0.4 + 0.5 x 0.6 = 0.5.
    pairs = [(1, 1)] * 20 + [(1, 0)] * 5 + [(0, 1)] * 10 + [(0, 0)] * 15
    assert agreement(pairs, 1).kappa == pytest.approx((0.7 - 0.5) / (1 - 0.5))


def test_the_confusion_matrix_counts_original_by_row_and_audit_by_column() -> None:
    assert confusion_matrix([(0, 2), (0, 2), (1, 0)], 2) == [[0, 0, 2], [1, 0, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match=r"outside 0\.\.2"):
        confusion_matrix([(3, 0)], 2)


def test_a_kind_without_pairs_has_null_figures() -> None:
    got = agreement([], 4, left_out=2)
    assert (got.pairs, got.left_out, got.exact, got.kappa) == (0, 2, None, None)
    assert got.confusion == [[0] * 5 for _ in range(5)]
    assert got.bias is None and got.marginals is None


# ----------------------------------------------------------------------------- pairs

Judged = dict[tuple[str, str, int, str], tuple[str, int | None, frozenset[str], int]]


def side(judged: Judged, history: bool = True) -> Side:
    return Side(judged, _advantages([[0.0]]), {}, history)


def ok(
    value: int | None, history: int = 0, matched: frozenset[str] = frozenset()
) -> tuple[str, int | None, frozenset[str], int]:
    return ("ok", value, matched, history)


FAILED = ("failed", None, frozenset(), 0)


def test_judgments_at_the_same_key_pair_their_levels() -> None:
    original = side({("visit", "r0", 1, "R1"): ok(2), ("visit", "r0", 3, "R1"): ok(1, history=1)})
    audit = side({("visit", "r0", 1, "R1"): ok(1), ("visit", "r0", 3, "R1"): ok(1, history=2)})
    pairs, _ = pair_judgments(original, audit, ["R1"])["visit"]
    assert sorted(pairs.pairs) == [(1, 1), (2, 1)] and pairs.left_out == 0


def test_a_key_where_either_side_failed_is_left_out_not_paired() -> None:
    original = side({("visit", "r0", 1, "R1"): FAILED, ("visit", "r0", 2, "R1"): ok(2)})
    audit = side({("visit", "r0", 1, "R1"): ok(2), ("visit", "r0", 2, "R1"): FAILED})
    pairs, first = pair_judgments(original, audit, ["R1"])["visit"]
    assert pairs.pairs == [] and pairs.left_out == 2
    assert first.left_out == 2  # both with an empty history


def test_a_judgment_one_side_never_made_is_neither_paired_nor_left_out() -> None:
    # No usable page (deterministic zero) on the original side; a snippet call skipped
    # as saturated by the audit judge.
    original = side({("visit", "r0", 1, "R1"): ("deterministic", 0, frozenset(), 0), ("snippet", "r0", 0, ""): ok(1)})
    audit = side({("visit", "r0", 1, "R1"): ok(0)})
    result = pair_judgments(original, audit, ["R1"])
    assert all(p.pairs == [] and p.left_out == 0 for p, _ in result.values())


def test_first_visits_are_those_with_an_empty_history_on_both_sides() -> None:
    original = side({("visit", "r0", 1, "R1"): ok(2, history=0), ("visit", "r0", 2, "R1"): ok(1, history=0)})
    audit = side({("visit", "r0", 1, "R1"): ok(2, history=0), ("visit", "r0", 2, "R1"): ok(0, history=3)})
    pairs, first = pair_judgments(original, audit, ["R1"])["visit"]
    assert sorted(pairs.pairs) == [(1, 0), (2, 2)] and first.pairs == [(2, 2)]


def test_without_history_every_visit_is_a_first_visit() -> None:
    original = side({("visit", "r0", 2, "R1"): ok(1, history=4)}, history=False)
    audit = side({("visit", "r0", 2, "R1"): ok(1, history=1)}, history=False)
    _, first = pair_judgments(original, audit, ["R1"])["visit"]
    assert first.pairs == [(1, 1)]


def test_a_snippet_call_pairs_each_positive_rubric_matched_or_not() -> None:
    original = side({("snippet", "r0", 0, ""): ok(1, matched=frozenset({"R1"}))})
    audit = side({("snippet", "r0", 0, ""): ok(2, matched=frozenset({"R1", "R3"}))})
    pairs, _ = pair_judgments(original, audit, ["R1", "R2", "R3"])["snippet"]
    assert pairs.pairs == [(1, 1), (0, 0), (0, 1)]


def test_a_failed_snippet_call_leaves_out_every_positive_rubric() -> None:
    original = side({("snippet", "r0", 0, ""): FAILED})
    audit = side({("snippet", "r0", 0, ""): ok(0)})
    pairs, _ = pair_judgments(original, audit, ["R1", "R2"])["snippet"]
    assert pairs.pairs == [] and pairs.left_out == 2


def test_report_rubrics_pair_their_scores_by_rollout_and_rubric() -> None:
    original = side(
        {("rubric", "r0", 5, "R1"): ok(4), ("rubric", "r0", 5, "P"): ok(0), ("rubric", "r1", 2, "R1"): FAILED}
    )
    audit = side({("rubric", "r0", 5, "R1"): ok(3), ("rubric", "r0", 5, "P"): ok(0), ("rubric", "r1", 2, "R1"): ok(1)})
    pairs, _ = pair_judgments(original, audit, ["R1"])["report_rubric"]
    assert sorted(pairs.pairs) == [(0, 0), (4, 3)] and pairs.left_out == 1


def test_citations_pair_their_joint_scores_by_claim() -> None:
    original = side({("citation", "r0", 5, "0:joint"): ok(2), ("citation", "r0", 5, "0:W1"): ok(1)})
    audit = side({("citation", "r0", 5, "0:joint"): ok(1), ("citation", "r0", 5, "0:W1"): ok(0)})
    pairs, _ = pair_judgments(original, audit, [])["citation"]
    assert pairs.pairs == [(2, 1)]  # the per-page calls are not compared


# ----------------------------------------------------------------------------- effect


def _advantages(turns: list[list[float]], fused: list[list[float]] | None = None) -> GroupAdvantages:
    """Rollouts whose non-final turns have these process (and fused) advantages, then an answer."""
    rollouts = []
    for r, values in enumerate(turns):
        fused_values = fused[r] if fused is not None else values
        made = [
            TurnAdvantage(i, "visit", 0.0, v, v, f) for i, (v, f) in enumerate(zip(values, fused_values, strict=True))
        ]
        made.append(TurnAdvantage(len(values), "answer", None, None, None, 0.0))
        rollouts.append(RolloutAdvantages(f"r{r}", None, 0.0, tuple(made)))
    return GroupAdvantages(GroupStats(0.0, 1.0, None, None, sum(len(t) for t in turns)), tuple(rollouts))


def test_the_effect_compares_corresponding_non_final_turns() -> None:
    original = _advantages([[1.0, -1.0]], [[2.0, -0.5]])
    audit = _advantages([[0.5, -1.0]], [[1.0, 0.5]])
    got = effect([original], [audit])
    assert got.turns == 2
    # Sorted (-1, 1) vs (-1, 0.5): W1 = (0 + 0.5) / 2; RMSE = sqrt((0.25 + 0) / 2).
    assert got.w1 == pytest.approx(0.25) and got.rmse == pytest.approx(math.sqrt(0.125))
    # Fused sorted (-0.5, 2) vs (0.5, 1): W1 = (1 + 1) / 2; RMSE = sqrt((1 + 1) / 2).
    assert got.fused_w1 == pytest.approx(1.0) and got.fused_rmse == pytest.approx(1.0)
    assert got.process_sign_agreement == 1.0 and got.fused_sign_agreement == 0.5


def test_values_within_the_neutral_band_share_a_sign() -> None:
    got = effect([_advantages([[5e-7, -1.0]])], [_advantages([[-5e-7, 1.0]])])
    assert got.process_sign_agreement == 0.5


def test_the_same_advantages_have_no_effect() -> None:
    same = _advantages([[0.3, -0.2], [1.1]])
    got = effect([same], [same])
    assert (got.w1, got.rmse, got.fused_w1, got.process_sign_agreement, got.fused_sign_agreement) == (0, 0, 0, 1, 1)


def test_outcome_rewards_are_compared_over_rollouts_both_judges_could_score() -> None:
    def with_rewards(rewards: dict[str, float | None]) -> Side:
        return Side({}, _advantages([[0.0]]), rewards, True)

    original = with_rewards({"r0": 0.5, "r1": None, "r2": 0.2})
    audit = with_rewards({"r0": 0.3, "r1": 0.9, "r2": 0.5})
    _, effect_doc = build_report([Compared("g", original, audit, [], outcome_judged=True)])
    # r1 is left out (the original could not score it): sqrt((0.2^2 + 0.3^2) / 2).
    assert effect_doc["outcome_rmse"] == pytest.approx(math.sqrt((0.04 + 0.09) / 2))
    assert effect_doc["groups"][0]["outcome_rmse"] == effect_doc["outcome_rmse"]
    _, given = build_report([Compared("g", original, audit, [], outcome_judged=False)])
    assert given["outcome_rmse"] is None


def test_rmse_without_pairs_is_null() -> None:
    assert rmse([]) is None
