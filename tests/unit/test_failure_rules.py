"""Unscorable turns and the three judge-failure policies (docs/method.md, "Judge failures"), by hand.

Failed judgments enter the credit math as level 0 / no matches under every policy (the
calls made are the same); ``Judgments.failed_*`` names them. Every number below is
worked out in the test's docstring.
"""

from __future__ import annotations

import math

import pytest

from drcredit.domain.advantages import group_advantages, outcome_advantages
from drcredit.domain.credit import Judgments, group_credits
from drcredit.domain.group import GroupIn
from drcredit.domain.params import ScoringParams
from tests.support.builders import answer, group, page, rollout, rubric, search, visit

RUBRICS = [rubric("R1"), rubric("R2")]


def three_rollouts(**params: object) -> tuple[GroupIn, Judgments]:
    """a: visit u1 (R1 2, R2 failed) then a search of u5 whose snippet call failed;
    b: a search of u2 then a visit of u2 (R1 2, R2 2); c: a visit of u3 (R1 1, R2 0).
    Rewards a 1.0, b 0.0, c 0.5."""
    g = group(
        rollout("a", visit(page("W1", "u1")), search(("S1", "u5")), answer(), reward=1.0),
        rollout("b", search(("S1", "u2")), visit(page("W1", "u2")), answer(), reward=0.0),
        rollout("c", visit(page("W1", "u3")), answer(), reward=0.5),
        rubrics=RUBRICS,
        params=params or None,
    )
    levels = {
        ("a", 0, "R1"): 2,
        ("a", 0, "R2"): 0,
        ("b", 1, "R1"): 2,
        ("b", 1, "R2"): 2,
        ("c", 0, "R1"): 1,
        ("c", 0, "R2"): 0,
    }
    judgments = Judgments(levels, {("a", 1): 0}, frozenset({("a", 0, "R2")}), frozenset({("a", 1)}))
    return g, judgments


def test_turns_depending_on_failed_judgments_are_flagged_and_scored_as_zero() -> None:
    """Policy zero: a0 = 0.5 (R2 counted as level 0) and a1 = 0 (no matches), both flagged;
    b0 = min(1, 1.0) navigation, b1 = min(1, 0.5 + 0.5) = 1.0, c0 = 0.2, none flagged.
    Pooled (0.5, 0, 1, 1, 0.2): mu = 0.54, sigma = sqrt(0.832 / 5) = 0.40792."""
    g, j = three_rollouts()
    credits = group_credits(g, j, g.params)
    assert [(t.credit, t.unscorable) for t in credits[0].turns] == [(0.5, True), (0.0, True), (None, False)]
    assert [(t.credit, t.unscorable) for t in credits[1].turns] == [(1.0, False), (1.0, False), (None, False)]
    adv = group_advantages(g, credits, g.params)
    assert adv.stats.mu_rg == pytest.approx(0.54)
    assert adv.stats.sigma_rg == pytest.approx(math.sqrt(0.832 / 5))
    assert adv.stats.research_turns == 5 and adv.stats.unscorable_turns == 2
    a0 = adv.rollouts[0].turns[0]
    assert a0.credit == 0.5 and a0.unscorable
    assert a0.process_advantage == pytest.approx((0.5 - 0.54) / math.sqrt(0.832 / 5))


def test_fail_policy_scores_like_zero() -> None:
    """Every policy computes credits as zero does; fail only decides the group's fate
    in the pipeline, so the math is the same as under zero."""
    g, j = three_rollouts()
    zero = group_advantages(g, group_credits(g, j, g.params), g.params)
    g2, _ = three_rollouts(on_judge_failure="fail")
    fail = group_advantages(g2, group_credits(g2, j, g2.params), g2.params)
    assert zero.rollouts == fail.rollouts


def test_exclude_leaves_unscorable_turns_out_of_the_normalization() -> None:
    """Policy exclude: pooled (1, 1, 0.2): mu = 11/15, sigma = 4 sqrt(2) / 15, so
    A_rg(b) = (4/15) / (4 sqrt(2)/15) = 1/sqrt(2) and A_rg(c) = -sqrt(2).
    a's two turns: credit null, A_rg 0, fused = A_o(a). Rewards (1, 0, 0.5): mu_o 0.5,
    sample sigma 0.5 -> A_o = (1, -1, 0)."""
    g, j = three_rollouts(on_judge_failure="exclude")
    adv = group_advantages(g, group_credits(g, j, g.params), g.params)
    assert adv.stats.mu_rg == pytest.approx(11 / 15)
    assert adv.stats.sigma_rg == pytest.approx(4 * math.sqrt(2) / 15)
    assert adv.stats.research_turns == 3 and adv.stats.unscorable_turns == 2
    a, b, c = adv.rollouts
    assert [r.outcome_advantage for r in adv.rollouts] == [pytest.approx(1), pytest.approx(-1), pytest.approx(0)]
    for t in a.turns[:2]:
        assert (t.credit, t.process_advantage, t.discounted_process_advantage, t.unscorable) == (None, 0.0, 0.0, True)
        assert t.advantage == pytest.approx(1.0)
    assert [t.process_advantage for t in b.turns[:2]] == [pytest.approx(1 / math.sqrt(2))] * 2
    assert b.turns[0].advantage == pytest.approx(-1 + 1 / math.sqrt(2))
    assert c.turns[0].process_advantage == pytest.approx(-math.sqrt(2))
    assert (a.turns[2].credit, a.turns[2].process_advantage, a.turns[2].advantage) == (None, None, a.outcome_advantage)


def test_exclude_with_discount_sees_zero_for_excluded_turns() -> None:
    """gamma 0.5 under exclude: a's D = (0 + 0.5 x 0, 0) = (0, 0);
    b's D1 = 1/sqrt(2), D0 = 1/sqrt(2) + 0.5/sqrt(2) = 1.5/sqrt(2)."""
    g, j = three_rollouts(on_judge_failure="exclude", discount=0.5)
    adv = group_advantages(g, group_credits(g, j, g.params), g.params)
    a, b, _ = adv.rollouts
    assert [t.discounted_process_advantage for t in a.turns] == [0.0, 0.0, None]
    assert b.turns[0].discounted_process_advantage == pytest.approx(1.5 / math.sqrt(2))
    assert b.turns[0].process_advantage == pytest.approx(1 / math.sqrt(2))
    assert b.turns[0].advantage == pytest.approx(-1 + 1.5 / math.sqrt(2))


def test_exclude_with_every_turn_unscorable_gives_zero_process_advantage() -> None:
    """Nothing left to normalize: mu_rg = sigma_rg = 0, every A_rg = 0, fused = A_o."""
    g = group(
        rollout("a", visit(page("W1", "u1")), reward=1.0),
        rollout("b", visit(page("W1", "u2")), reward=0.0),
        params={"on_judge_failure": "exclude"},
    )
    j = Judgments({("a", 0, "R1"): 0, ("b", 0, "R1"): 0}, {}, frozenset({("a", 0, "R1"), ("b", 0, "R1")}))
    adv = group_advantages(g, group_credits(g, j, g.params), g.params)
    assert (adv.stats.mu_rg, adv.stats.sigma_rg, adv.stats.research_turns) == (0.0, 0.0, 0)
    s = 1 / math.sqrt(2)
    assert [t.advantage for r in adv.rollouts for t in r.turns] == [pytest.approx(s), pytest.approx(-s)]


def latest_group(**params: object) -> tuple[GroupIn, Judgments]:
    """a: two searches both returning u1, then a visit of u1 whose only judgment failed."""
    g = group(
        rollout("a", search(("S1", "u1")), search(("S2", "u1")), visit(page("W1", "u1"))),
        rollout("b", visit(page("W1", "u2"))),
        params=params or None,
    )
    j = Judgments({("a", 2, "R1"): 0, ("b", 0, "R1"): 1}, {}, frozenset({("a", 2, "R1")}))
    return g, j


def test_navigation_carries_unscorability_to_every_credited_search() -> None:
    """attribution all: both searches sum the failed visit's credit -> both unscorable."""
    g, j = latest_group()
    assert [t.unscorable for t in group_credits(g, j, g.params)[0].turns] == [True, True, True]


def test_latest_attribution_flags_only_the_credited_search() -> None:
    """attribution latest: only S2's turn (the latest return of u1) sums the visit."""
    g, j = latest_group(attribution="latest")
    assert [t.unscorable for t in group_credits(g, j, g.params)[0].turns] == [False, True, True]


def test_without_navigation_a_search_does_not_depend_on_visits() -> None:
    """navigation false: cnav = 0 sums nothing, so no search is unscorable."""
    g, j = latest_group(navigation=False)
    assert [t.unscorable for t in group_credits(g, j, g.params)[0].turns] == [False, False, True]


def test_a_failed_snippet_call_not_needed_under_other_params_does_not_count() -> None:
    """snippets false (a replay): the failed snippet call is no longer part of the credit."""
    g, j = three_rollouts(snippets=False)
    assert [t.unscorable for t in group_credits(g, j, g.params)[0].turns] == [True, False, False]


def test_outcome_advantage_over_the_rewards_present() -> None:
    """Rewards (1, None, 0, 0.5): the null one gets A_o 0 and is left out: mu_o 0.5,
    sigma_o 0.5 -> (1, 0, -1, 0). One reward left: A_o 0 for all. None: stats None."""
    mu, sigma, a_o = outcome_advantages([1.0, None, 0.0, 0.5])
    assert (mu, sigma) == (0.5, 0.5) and a_o == [1.0, 0.0, -1.0, 0.0]
    assert outcome_advantages([None, 0.7])[2] == [0.0, 0.0]
    assert outcome_advantages([None, None]) == (None, None, [0.0, 0.0])


def test_exclude_is_a_valid_policy() -> None:
    assert ScoringParams(on_judge_failure="exclude").on_judge_failure == "exclude"
