"""One test per rule of docs/method.md ("Visit credit" to "Advantages"), with expected numbers computed by hand.

The judge's answers enter as ordinal levels and match counts (``Judgments``); every
number asserted below is worked out in the test's docstring from the formulas of docs/method.md.
"""

from __future__ import annotations

import math

import pytest

from drcredit.domain.advantages import group_advantages
from drcredit.domain.credit import (
    Judgments,
    MissingJudgment,
    group_credits,
    navigation_links,
    plan_rollout,
    snippet_decision,
)
from drcredit.domain.group import GroupIn
from drcredit.domain.params import ScoringParams
from tests.support.builders import answer, group, page, rollout, rubric, search, tool, visit

P = ScoringParams()
RUBRICS3 = [rubric("R1"), rubric("R2"), rubric("R3"), rubric("PEN", weight=-1.0)]


def credits_of(
    g: GroupIn,
    visit_levels: dict[tuple[str, int, str], int] | None = None,
    snippets: dict[tuple[str, int], int] | None = None,
    params: ScoringParams = P,
) -> dict[str, list[float | None]]:
    result = group_credits(g, Judgments(visit_levels or {}, snippets or {}), params)
    return {rc.rollout_id: [t.credit for t in rc.turns] for rc in result}


def filler(rid: str = "z") -> dict[str, object]:
    return rollout(rid, answer())


# ----------------------------------------------------------------------------- section 3


def test_visit_levels_sum_and_cap() -> None:
    """Levels (2, 2, 1) -> 0.5 + 0.5 + 0.2 = 1.2 uncapped, min(1, 1.2) = 1.0 capped;
    a second visit with (1, 0, 0) -> 0.2. The penalty rubric needs no judgment."""
    g = group(rollout("a", visit(page("W1", "u1")), visit(page("W2", "u2")), answer()), filler(), rubrics=RUBRICS3)
    levels = {
        ("a", 0, "R1"): 2,
        ("a", 0, "R2"): 2,
        ("a", 0, "R3"): 1,
        ("a", 1, "R1"): 1,
        ("a", 1, "R2"): 0,
        ("a", 1, "R3"): 0,
    }
    result = group_credits(g, Judgments(levels, {}), P)[0]
    assert result.turns[0].visit_credit_uncapped == pytest.approx(1.2)
    assert result.turns[0].credit == 1.0
    assert result.turns[1].credit == pytest.approx(0.2)
    assert result.turns[2].credit is None


def test_custom_visit_levels_and_cap() -> None:
    """visit_levels (0, 0.25, 0.6), cap 0.75: (1, 1, 0) -> 0.5; (2, 1, 0) -> min(0.75, 0.85) = 0.75."""
    params = ScoringParams(visit_levels=(0, 0.25, 0.6), cap=0.75)
    g = group(rollout("a", visit(page("W1", "u1")), visit(page("W2", "u2"))), filler(), rubrics=RUBRICS3)
    levels = {
        ("a", 0, "R1"): 1,
        ("a", 0, "R2"): 1,
        ("a", 0, "R3"): 0,
        ("a", 1, "R1"): 2,
        ("a", 1, "R2"): 1,
        ("a", 1, "R3"): 0,
    }
    assert credits_of(g, levels, params=params)["a"] == [pytest.approx(0.5), pytest.approx(0.75)]


def test_visit_without_usable_page_is_a_deterministic_zero() -> None:
    """Pages with an error, or blank evidence, are unusable: no chain step, credit 0,
    and no judgment is needed. A visit with one failed and one usable page is judged."""
    dead = visit(page("W1", "u1", error="403"), page("W2", "u2", evidence="   "))
    mixed = visit(page("W3", "u3", error="timeout"), page("W4", "u4"))
    g = group(rollout("a", dead, mixed), filler(), rubrics=[rubric("R1")])
    plan = plan_rollout(g, g.rollouts[0], P)
    assert plan.deterministic_zero_visits == (0,)
    assert [c.turn_indices for c in plan.chains] == [(1,)]
    assert credits_of(g, {("a", 1, "R1"): 2})["a"] == [0.0, 0.5]
    with pytest.raises(MissingJudgment):
        credits_of(g, {})


def test_chains_are_per_positive_rubric_in_turn_order() -> None:
    """One chain per (rollout, positive rubric); the penalty rubric gets none."""
    g = group(
        rollout("a", visit(page("W1", "u1")), search(("S1", "x")), visit(page("W2", "u2"))), filler(), rubrics=RUBRICS3
    )
    chains = plan_rollout(g, g.rollouts[0], P).chains
    assert [(c.rubric_id, c.turn_indices) for c in chains] == [("R1", (0, 2)), ("R2", (0, 2)), ("R3", (0, 2))]


# ----------------------------------------------------------------------------- section 4: navigation


def nav_rollout() -> dict[str, object]:
    # t0 returns A and B, t1 returns A; t2 visits A, t3 visits B, t4 visits C (never returned).
    return rollout(
        "a",
        search(("S1", "https://a.org/x"), ("S2", "https://b.org/y")),
        search(("S3", "http://www.a.org/x/?utm_source=feed")),
        visit(page("W1", "https://a.org/x")),
        visit(page("W2", "https://b.org/y")),
        visit(page("W3", "https://c.org/z")),
    )


NAV_LEVELS = {("a", 2, "R1"): 2, ("a", 3, "R1"): 1, ("a", 4, "R1"): 2}  # cv = 0.5, 0.2, 0.5


def test_navigation_attribution_all() -> None:
    """all: t0 is credited by t2 (A) and t3 (B): 0.5 + 0.2 = 0.7; t1 by t2 only: 0.5
    (its URL matches A after normalization). No snippet is eligible (all visited)."""
    g = group(nav_rollout(), filler())
    assert navigation_links(g.rollouts[0], "all") == {0: [2, 3], 1: [2]}
    assert credits_of(g, NAV_LEVELS)["a"][:2] == [pytest.approx(0.7), 0.5]


def test_navigation_attribution_latest() -> None:
    """latest: A's latest search before t2 is t1, so t1 gets 0.5 and t0 keeps only B: 0.2."""
    g = group(nav_rollout(), filler(), params={"attribution": "latest"})
    assert navigation_links(g.rollouts[0], "latest") == {0: [3], 1: [2]}
    assert credits_of(g, NAV_LEVELS, params=g.params)["a"][:2] == [pytest.approx(0.2), 0.5]


def test_navigation_is_capped_and_counts_each_visit_once() -> None:
    """A visit calling two URLs of the same search counts once: t1 (both URLs, cv 0.7)
    + t2 (cv 0.6) = 1.3 -> capped at 1. A visit before the search gives nothing."""
    r = rollout(
        "a",
        visit(page("W0", "https://a.org/x")),
        search(("S1", "https://a.org/x"), ("S2", "https://b.org/y")),
        visit(page("W1", "https://a.org/x"), page("W2", "https://b.org/y")),
        visit(page("W3", "https://b.org/y")),
    )
    g = group(r, filler(), rubrics=[rubric("R1"), rubric("R2")])
    levels = {
        ("a", 0, "R1"): 2,
        ("a", 0, "R2"): 2,
        ("a", 2, "R1"): 2,
        ("a", 2, "R2"): 1,
        ("a", 3, "R1"): 1,
        ("a", 3, "R2"): 1,
    }
    links = navigation_links(g.rollouts[0], "all")
    assert links == {1: [2, 3]}
    result = group_credits(g, Judgments(levels, {}), P)[0]
    assert result.turns[1].navigation_credit == 1.0
    assert result.turns[1].credit == 1.0


def test_navigation_switched_off() -> None:
    """navigation=false: cnav = 0, so the search's credit is only its snippet credit."""
    g = group(
        rollout(
            "a",
            search(("S1", "https://a.org/x"), ("S2", "https://n.org/1", "fact")),
            visit(page("W1", "https://a.org/x")),
        ),
        filler(),
        params={"navigation": False},
    )
    assert credits_of(g, {("a", 1, "R1"): 2}, {("a", 0): 1}, params=g.params)["a"] == [pytest.approx(0.1), 0.5]


def test_search_with_error_or_no_results_has_zero_credit() -> None:
    """A search carrying an error earns nothing even if a later visit hits its URL."""
    r = rollout(
        "a", search(("S1", "https://a.org/x"), error="rate limited"), search(), visit(page("W1", "https://a.org/x"))
    )
    g = group(r, filler())
    plan = plan_rollout(g, g.rollouts[0], P)
    assert plan.snippet_tasks == ()
    assert credits_of(g, {("a", 2, "R1"): 2})["a"] == [0.0, 0.0, 0.5]


# ----------------------------------------------------------------------------- section 4: snippets


def test_snippet_eligibility_excludes_urls_visited_before_or_after() -> None:
    """Results visited earlier (B) or later (A) are not eligible; only C is."""
    r = rollout(
        "a",
        visit(page("W0", "https://b.org/y")),
        search(("S1", "https://a.org/x"), ("S2", "https://www.b.org/y/"), ("S3", "https://c.org/z")),
        visit(page("W1", "https://a.org/x")),
    )
    g = group(r, filler())
    (task,) = plan_rollout(g, g.rollouts[0], P).snippet_tasks
    assert task.turn_index == 1
    assert [x.id for x in task.eligible] == ["S3"]
    assert task.navigation_visits == (2,)


def test_no_eligible_result_means_no_snippet_call() -> None:
    r = rollout("a", search(("S1", "https://a.org/x")), visit(page("W1", "https://a.org/x")))
    g = group(r, filler())
    assert plan_rollout(g, g.rollouts[0], P).snippet_tasks == ()
    assert credits_of(g, {("a", 1, "R1"): 1})["a"] == [pytest.approx(0.2), pytest.approx(0.2)]


def test_snippet_credit_is_eta_per_accepted_match() -> None:
    """2 accepted matches, eta 0.1, no navigation: cs = 0.2; eta 0.3 -> 0.6."""
    g = group(rollout("a", search(("S1", "https://n.org/1"))), filler())
    assert credits_of(g, {}, {("a", 0): 2})["a"] == [pytest.approx(0.2)]
    assert credits_of(g, {}, {("a", 0): 2}, params=ScoringParams(snippet_weight=0.3))["a"] == [pytest.approx(0.6)]


def test_snippets_switched_off() -> None:
    g = group(rollout("a", search(("S1", "https://n.org/1"))), filler(), params={"snippets": False})
    assert plan_rollout(g, g.rollouts[0], g.params).snippet_tasks == ()
    assert credits_of(g, {}, {}, params=g.params)["a"] == [0.0]


def saturated_rollout() -> dict[str, object]:
    # t0 returns A (visited at t1 with cv 1.0) and N (never visited).
    return rollout(
        "a",
        search(("S1", "https://a.org/x"), ("S2", "https://n.org/1", "a fact")),
        visit(page("W1", "https://a.org/x")),
    )


SAT_LEVELS = {("a", 1, "R1"): 2, ("a", 1, "R2"): 2}  # cv = min(1, 1.0) = 1.0


def test_saturated_search_skips_its_snippet_call() -> None:
    """cnav = 1.0 >= cap: the snippet call is skipped and csnp = 0, cs = 1.0."""
    g = group(saturated_rollout(), filler(), rubrics=[rubric("R1"), rubric("R2")])
    (task,) = plan_rollout(g, g.rollouts[0], P).snippet_tasks
    assert snippet_decision(task, {}, P) == "wait"
    assert snippet_decision(task, {1: 1.0}, P) == "skip"
    assert snippet_decision(task, {1: 0.7}, P) == "call"
    result = group_credits(g, Judgments(SAT_LEVELS, {}), P)[0]
    assert (result.turns[0].navigation_credit, result.turns[0].snippet_credit, result.turns[0].credit) == (
        1.0,
        0.0,
        1.0,
    )


def test_saturation_skip_can_be_switched_off_and_search_credit_is_capped() -> None:
    """skip_saturated_snippets=false: the call is made at once; cnav 1.0 + 3 x 0.1 = 1.3 -> cs = 1.0."""
    params = ScoringParams(skip_saturated_snippets=False)
    g = group(
        saturated_rollout(), filler(), rubrics=[rubric("R1"), rubric("R2")], params={"skip_saturated_snippets": False}
    )
    (task,) = plan_rollout(g, g.rollouts[0], params).snippet_tasks
    assert snippet_decision(task, {}, params) == "call"
    result = group_credits(g, Judgments(SAT_LEVELS, {("a", 0): 3}), params)[0]
    assert result.turns[0].snippet_credit == pytest.approx(0.3)
    assert result.turns[0].credit == 1.0


def test_search_credit_cap_with_partial_navigation() -> None:
    """Visit levels (2, 1) -> cv 0.7 = cnav, below the cap, so snippets are judged:
    0.7 + 4 x 0.1 = 1.1 -> cs = min(1, 1.1) = 1.0; with 2 matches 0.7 + 0.2 = 0.9."""
    g = group(saturated_rollout(), filler(), rubrics=[rubric("R1"), rubric("R2")])
    levels = {("a", 1, "R1"): 2, ("a", 1, "R2"): 1}
    assert credits_of(g, levels, {("a", 0): 4})["a"][0] == 1.0
    assert credits_of(g, levels, {("a", 0): 2})["a"][0] == pytest.approx(0.9)


# ----------------------------------------------------------------------------- sections 5-6


def two_turn_group(c_a: int, c_b: int, ra: float = 1.0, rb: float = 0.0, **params: object) -> tuple[GroupIn, Judgments]:
    g = group(
        rollout("a", visit(page("W1", "u1")), answer(), reward=ra),
        rollout("b", visit(page("W1", "u1")), answer(), reward=rb),
        params=params or None,
    )
    return g, Judgments({("a", 0, "R1"): c_a, ("b", 0, "R1"): c_b}, {})


def advantages(g: GroupIn, j: Judgments) -> dict[str, list[float]]:
    adv = group_advantages(g, group_credits(g, j, g.params), g.params)
    return {r.rollout_id: [t.advantage for t in r.turns] for r in adv.rollouts}


def test_population_std_for_process_and_sample_std_for_outcome() -> None:
    """Credits (0.5, 0): mu 0.25, population sigma 0.25 -> A_rg = +1, -1.
    Rewards (1, 0): mu 0.5, sample sigma sqrt(0.5) = 0.70711 -> A_o = +0.70711, -0.70711."""
    g, j = two_turn_group(2, 0)
    adv = group_advantages(g, group_credits(g, j, P), P)
    assert (adv.stats.mu_rg, adv.stats.sigma_rg) == (0.25, 0.25)
    assert adv.stats.sigma_o == pytest.approx(math.sqrt(0.5))
    a, b = adv.rollouts
    s = 1 / math.sqrt(2)
    assert a.outcome_advantage == pytest.approx(s) and b.outcome_advantage == pytest.approx(-s)
    assert [t.process_advantage for t in a.turns] == [1.0, None]
    assert a.turns[0].advantage == pytest.approx(s + 1) and b.turns[0].advantage == pytest.approx(-s - 1)


def test_final_answer_turn_gets_only_the_outcome_advantage() -> None:
    g, j = two_turn_group(2, 0)
    adv = group_advantages(g, group_credits(g, j, P), P)
    final = adv.rollouts[0].turns[-1]
    assert (final.credit, final.process_advantage, final.advantage) == (None, None, adv.rollouts[0].outcome_advantage)


def test_zero_variance_credits_give_zero_process_advantage() -> None:
    """Equal credits: sigma_rg = 0 < 1e-12 -> A_rg = 0; A = A_o on every turn."""
    g, j = two_turn_group(1, 1)
    out = advantages(g, j)
    s = 1 / math.sqrt(2)
    assert out["a"] == [pytest.approx(s), pytest.approx(s)]


def test_zero_variance_outcomes_give_zero_outcome_advantage() -> None:
    g, j = two_turn_group(2, 0, ra=0.3, rb=0.3)
    assert advantages(g, j) == {"a": [1.0, 0.0], "b": [-1.0, 0.0]}


def test_zero_credit_turns_count_equally_in_normalization() -> None:
    """Turns: a = (visit 0.5, tool 0, search-with-error 0), b = (visit 0): mu = 0.125,
    sigma = sqrt((0.375^2 + 3 x 0.125^2) / 4) = 0.21651; A_rg(a0) = 0.375 / 0.21651 = 1.73205."""
    g = group(
        rollout("a", visit(page("W1", "u1")), tool(), search(error="boom"), reward=None),
        rollout("b", visit(page("W1", "u1")), reward=None),
    )
    j = Judgments({("a", 0, "R1"): 2, ("b", 0, "R1"): 0}, {})
    adv = group_advantages(g, group_credits(g, j, P), P)
    assert adv.stats.mu_rg == 0.125
    assert adv.stats.sigma_rg == pytest.approx(math.sqrt((0.375**2 + 3 * 0.125**2) / 4))
    assert adv.rollouts[0].turns[0].process_advantage == pytest.approx(math.sqrt(3))
    assert adv.rollouts[0].turns[1].process_advantage == pytest.approx(-1 / math.sqrt(3))
    # No outcome rewards at all: the outcome advantage is 0 and the stats say so.
    assert (adv.stats.mu_o, adv.stats.sigma_o, adv.rollouts[0].outcome_advantage) == (None, None, 0.0)


def discount_group(**params: object) -> tuple[GroupIn, Judgments]:
    # a: visits with credits 0.5, 0, 0.2; b: one visit 0. Pooled (0.5, 0, 0.2, 0).
    g = group(
        rollout("a", visit(page("W1", "u1")), visit(page("W2", "u2")), visit(page("W3", "u3")), answer(), reward=1.0),
        rollout("b", visit(page("W1", "u1")), answer(), reward=0.0),
        params=params or None,
    )
    return g, Judgments({("a", 0, "R1"): 2, ("a", 1, "R1"): 0, ("a", 2, "R1"): 1, ("b", 0, "R1"): 0}, {})


# mu = 0.7 / 4 = 0.175; sigma = sqrt((0.325^2 + 0.175^2 + 0.025^2 + 0.175^2) / 4)
MU = 0.175
SIGMA = math.sqrt((0.325**2 + 0.175**2 + 0.025**2 + 0.175**2) / 4)
ARG = [(0.5 - MU) / SIGMA, (0 - MU) / SIGMA, (0.2 - MU) / SIGMA]
AO = 1 / math.sqrt(2)


def test_discount_accumulates_backwards_within_the_rollout() -> None:
    """gamma 0.5: D2 = A2, D1 = A1 + 0.5 A2, D0 = A0 + 0.5 D1; the answer is excluded."""
    g, j = discount_group(discount=0.5)
    adv = group_advantages(g, group_credits(g, j, g.params), g.params)
    d2 = ARG[2]
    d1 = ARG[1] + 0.5 * d2
    d0 = ARG[0] + 0.5 * d1
    got = [t.discounted_process_advantage for t in adv.rollouts[0].turns]
    assert got[:3] == [pytest.approx(d0), pytest.approx(d1), pytest.approx(d2)] and got[3] is None
    # process_advantage stays A_rg whatever the discount (docs/api.md).
    assert [t.process_advantage for t in adv.rollouts[0].turns[:3]] == [pytest.approx(x) for x in ARG]
    assert adv.rollouts[0].turns[0].advantage == pytest.approx(AO + d0)


def test_process_weight_scales_the_process_term() -> None:
    """w = 0.5: A = A_o + 0.5 D on research turns; the final turn stays A_o."""
    g, j = discount_group(process_weight=0.5)
    out = advantages(g, j)
    assert out["a"] == [pytest.approx(AO + 0.5 * x) for x in ARG] + [pytest.approx(AO)]


def test_process_only_ablation() -> None:
    """outcome_on_research_turns = false: A = w D on research turns, A_o on the answer."""
    g, j = discount_group(outcome_on_research_turns=False, process_weight=2.0)
    out = advantages(g, j)
    assert out["a"] == [pytest.approx(2 * x) for x in ARG] + [pytest.approx(AO)]
    assert out["b"] == [pytest.approx(2 * (0 - MU) / SIGMA), pytest.approx(-AO)]


def test_rollout_without_answer_has_only_non_final_turns() -> None:
    """A rollout cut at the turn limit: every turn is a research turn with a process term."""
    g = group(
        rollout("a", visit(page("W1", "u1")), reward=1.0), rollout("b", visit(page("W1", "u1")), answer(), reward=0.0)
    )
    j = Judgments({("a", 0, "R1"): 2, ("b", 0, "R1"): 0}, {})
    adv = group_advantages(g, group_credits(g, j, P), P)
    assert [t.process_advantage for t in adv.rollouts[0].turns] == [1.0]
    assert [t.process_advantage for t in adv.rollouts[1].turns] == [-1.0, None]


def test_failed_judgment_under_policy_zero_scores_level_zero() -> None:
    """Stored failures enter as level 0 / no matches (the pipeline stores them so)."""
    g, _ = two_turn_group(0, 0)
    assert credits_of(g, {("a", 0, "R1"): 0, ("b", 0, "R1"): 0}) == {"a": [0.0, None], "b": [0.0, None]}


def test_huge_finite_rewards_do_not_overflow() -> None:
    """Rewards (1e200, 0): mean 5e199, sample std 1e200 / sqrt(2) -> A_o = +-0.70711."""
    g = group(rollout("a", tool(), reward=1e200), rollout("b", tool(), reward=0.0))
    adv = group_advantages(g, group_credits(g, Judgments({}, {}), P), P)
    assert [r.outcome_advantage for r in adv.rollouts] == [
        pytest.approx(1 / math.sqrt(2)),
        pytest.approx(-1 / math.sqrt(2)),
    ]
    same = group(rollout("a", tool(), reward=1.7e308), rollout("b", tool(), reward=1.7e308))
    assert group_advantages(same, group_credits(same, Judgments({}, {}), P), P).rollouts[0].outcome_advantage == 0.0
