"""Property tests of the pure core (``drcredit.domain``) over random valid groups.

A strategy draws a whole rollout group (docs/method.md, "Input"), scoring parameters (docs/parameters.md)
and ordinal judgments consistent with both (a level for every judged visit, a match
count for every planned snippet call), then checks invariants of sections 3-6 that hold
for any input: advantages are finite, normalization is centred and scaled, rollout order
does not matter, credits stay in [0, cap], and a higher level never lowers a credit.

Numeric parameters are drawn on a decimal grid (multiples of 0.01). Mathematically
distinct credits then differ by at least ~0.01, so ``sigma_rg`` is either float noise
below the 1e-12 floor or large enough for the 1e-9 tolerances to be meaningful; with
arbitrary floats, two credits 1e-11 apart would make ``(c - mu) / sigma`` ill-conditioned
and the properties would test float rounding rather than the scorer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from drcredit.domain.advantages import SIGMA_FLOOR, GroupAdvantages, group_advantages
from drcredit.domain.credit import Judgments, RolloutCredits, group_credits, plan_rollout
from drcredit.domain.group import GroupIn, VisitTurn
from drcredit.domain.outline import outline_turns
from drcredit.domain.params import ScoringParams

SETTINGS = settings(max_examples=150, deadline=None)

#: A small URL pool, with variants that normalize to the same URL (docs/method.md, "URL normalization"),
#: so that visits often match earlier search results.
URL_POOL = (
    "https://a.org/x",
    "http://www.a.org/x/?utm_source=feed",
    "https://b.org/y?k=1&j=2",
    "https://b.org/y?j=2&k=1#top",
    "https://c.org/z",
    "https://d.org/",
    "https://e.org/w",
)


def grid(low: int, high: int) -> st.SearchStrategy[float]:
    """Multiples of 0.01 between low/100 and high/100."""
    return st.integers(low, high).map(lambda k: k / 100)


# ----------------------------------------------------------------------------- strategies
#
# Strategies are built once at import: building them inside a composite on every draw
# costs more than the scoring itself.

#: Every search outcome over the pool: 0-3 result URLs (repeats allowed), with or without
#: an error, ordered so that shrinking goes towards few results and no error.
SEARCH_VARIANTS = sorted(
    (
        (urls, error)
        for urls in [
            (),
            *((a,) for a in URL_POOL),
            *((a, b) for a in URL_POOL for b in URL_POOL),
            *((a, b, c) for a in URL_POOL for b in URL_POOL for c in URL_POOL),
        ]
        for error in (None, "rate limited")
    ),
    key=lambda v: (v[1] is not None, len(v[0])),
)

#: Every page shape: a pool URL, evidence (some blank or missing) and an optional error.
PAGE_VARIANTS = [
    (url, evidence, error)
    for error in (None, "403 forbidden")
    for evidence in ("useful evidence", "more evidence", "   ", "", None)
    for url in URL_POOL
]


def _search_turn(variant: tuple[tuple[str, ...], str | None]) -> dict[str, Any]:
    urls, error = variant
    turn: dict[str, Any] = {
        "type": "search",
        "reasoning": "look it up",
        "call": {"queries": ["q"]},
        # ids are filled in per rollout so that they are unique within it
        "results": [{"url": u, "title": "t", "snippet": f"snippet about {u}"} for u in urls],
    }
    if error is not None:
        turn["error"] = error
    return turn


def _visit_turn(drawn: tuple[list[tuple[str, str | None, str | None]], int, str]) -> dict[str, Any]:
    page_variants, own_urls, other_url = drawn
    visited = [{"url": url, "evidence": ev, "summary": "summary", "error": error} for url, ev, error in page_variants]
    # Usually the pages' own URLs are the ones called; sometimes the call differs.
    called = [p["url"] for p in visited] if own_urls else [other_url]
    return {"type": "visit", "reasoning": "read", "call": {"urls": called, "goal": "find"}, "pages": visited}


SEARCH_TURNS = st.sampled_from(SEARCH_VARIANTS).map(_search_turn)
VISIT_TURNS = st.tuples(
    st.lists(st.sampled_from(PAGE_VARIANTS), min_size=1, max_size=2), st.integers(0, 3), st.sampled_from(URL_POOL)
).map(_visit_turn)
TOOL_TURNS = st.just({"type": "tool", "name": "calculator", "arguments": {"x": 1}, "response": "2"})
ROLLOUT_SHAPES = st.tuples(st.lists(st.one_of(SEARCH_TURNS, VISIT_TURNS, TOOL_TURNS), max_size=8), st.booleans())
WEIGHTS = st.lists(st.sampled_from([1.0, 2.0, 0.5, 3.0, 0.0, -0.5, -1.0]), min_size=1, max_size=4)
RUBRIC_TYPES = st.sampled_from(["factual", "logical"])
REWARDS = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False))


def rollout_doc(rid: str, shape: tuple[list[dict[str, Any]], bool]) -> dict[str, Any]:
    """Number result and page ids S1, S2, ... and W1, W2, ... within the rollout."""
    turns, answered = shape
    s = w = 0
    numbered = []
    for turn in turns:
        turn = dict(turn)
        if turn["type"] == "search":
            results = []
            for r in turn["results"]:
                s += 1
                results.append({"id": f"S{s}", **r})
            turn["results"] = results
        elif turn["type"] == "visit":
            visited = []
            for p in turn["pages"]:
                w += 1
                visited.append({"id": f"W{w}", **p})
            turn["pages"] = visited
        numbered.append(turn)
    if answered:
        numbered.append({"type": "answer", "reasoning": "done", "answer": "final report"})
    return {"id": rid, "turns": numbered}


@st.composite
def group_docs(draw: st.DrawFn) -> dict[str, Any]:
    weights = draw(WEIGHTS)
    if not any(wt > 0 for wt in weights):
        weights[0] = 1.0
    rubrics = [
        {"id": f"R{k}", "type": draw(RUBRIC_TYPES), "description": f"rubric {k}", "weight": wt, "trusted_evidence": []}
        for k, wt in enumerate(weights)
    ]
    shapes = draw(st.lists(ROLLOUT_SHAPES, min_size=2, max_size=6))
    rollouts = [rollout_doc(f"r{i}", shape) for i, shape in enumerate(shapes)]
    if draw(st.booleans()):
        for r in rollouts:
            r["outcome_reward"] = draw(REWARDS)
    return {"question": "What happened?", "rubrics": rubrics, "rollouts": rollouts}


GROUP_DOCS = group_docs()

SCORING_PARAMS = st.fixed_dictionaries(
    {
        "visit_levels": st.lists(grid(0, 100), min_size=3, max_size=3).map(sorted),
        "cap": grid(1, 200),
        "snippet_weight": grid(0, 50),
        "history": st.booleans(),
        "navigation": st.booleans(),
        "snippets": st.booleans(),
        "attribution": st.sampled_from(["all", "latest"]),
        "skip_saturated_snippets": st.booleans(),
        "discount": st.one_of(st.just(0.0), grid(0, 100)),
        "process_weight": grid(0, 300),
        "outcome_on_research_turns": st.booleans(),
    }
).map(ScoringParams.model_validate)

_BYTES: dict[int, st.SearchStrategy[bytes]] = {}


def fixed_bytes(n: int) -> st.SearchStrategy[bytes]:
    if n not in _BYTES:
        _BYTES[n] = st.binary(min_size=n, max_size=n)
    return _BYTES[n]


@dataclass(frozen=True)
class Case:
    doc: dict[str, Any]
    group: GroupIn
    params: ScoringParams
    judgments: Judgments


@st.composite
def _cases(draw: st.DrawFn) -> Case:
    doc = draw(GROUP_DOCS)
    group = GroupIn.model_validate(doc)
    params = draw(SCORING_PARAMS)
    positive = group.positive_rubrics
    visit_keys = [
        (rollout.id, t, rubric.id)
        for rollout in group.rollouts
        for t, turn in enumerate(rollout.turns)
        if isinstance(turn, VisitTurn) and turn.usable_pages
        for rubric in positive
    ]
    # A count for every planned snippet call, even one that saturation may skip.
    search_keys = [
        (rollout.id, task.turn_index)
        for rollout in group.rollouts
        for task in plan_rollout(group, rollout, params).snippet_tasks
    ]
    # One byte per judgment (a single cheap draw); shrinks towards level 0 / no match.
    levels = dict(zip(visit_keys, (b % 3 for b in draw(fixed_bytes(len(visit_keys)))), strict=True))
    matches = dict(
        zip(search_keys, (b % (len(positive) + 1) for b in draw(fixed_bytes(len(search_keys)))), strict=True)
    )
    return Case(doc, group, params, Judgments(levels, matches))


CASES = _cases()


def score(
    case: Case, group: GroupIn | None = None, judgments: Judgments | None = None
) -> tuple[list[RolloutCredits], GroupAdvantages]:
    g = case.group if group is None else group
    credits = group_credits(g, case.judgments if judgments is None else judgments, case.params)
    return credits, group_advantages(g, credits, case.params)


# ----------------------------------------------------------------------------- properties


@SETTINGS
@given(CASES)
def test_every_advantage_is_finite(case: Case) -> None:
    _, adv = score(case)
    assert math.isfinite(adv.stats.mu_rg) and math.isfinite(adv.stats.sigma_rg)
    for r in adv.rollouts:
        assert math.isfinite(r.outcome_advantage)
        for t in r.turns:
            assert math.isfinite(t.advantage)
            for value in (t.process_advantage, t.discounted_process_advantage):
                assert value is None or math.isfinite(value)


@SETTINGS
@given(CASES)
def test_process_advantages_are_centred_and_scaled(case: Case) -> None:
    """Over the pooled non-final turns: A_rg has mean 0 and population std 1 when
    sigma_rg >= 1e-12, and is 0 everywhere otherwise; with gamma = 0 the process
    advantage D equals A_rg, and the fused advantage is A_o + w D (docs/method.md, "Advantages")."""
    _, adv = score(case)
    turns = [(r, t) for r in adv.rollouts for t in r.turns if t.credit is not None]
    assert adv.stats.research_turns == len(turns)
    normalized = [t.process_advantage for _, t in turns]
    assert all(x is not None for x in normalized)
    a_rg = [float(x) for x in normalized if x is not None]
    if adv.stats.sigma_rg >= SIGMA_FLOOR:
        n = len(a_rg)
        mean = math.fsum(a_rg) / n
        assert abs(mean) <= 1e-9
        assert abs(math.sqrt(math.fsum((x - mean) ** 2 for x in a_rg) / n) - 1) <= 1e-9
    else:
        assert all(x == 0.0 for x in a_rg)
    p = case.params
    if p.discount == 0:
        for r, t in turns:
            assert t.discounted_process_advantage == t.process_advantage
            outcome = r.outcome_advantage if p.outcome_on_research_turns else 0.0
            expected = outcome + p.process_weight * float(t.process_advantage or 0.0)
            assert math.isclose(t.advantage, expected, rel_tol=1e-12, abs_tol=1e-12)


@SETTINGS
@given(CASES, st.data())
def test_rollout_order_does_not_matter(case: Case, data: st.DataObject) -> None:
    _, reference = score(case)
    by_id = {r.rollout_id: r for r in reference.rollouts}
    n = len(case.doc["rollouts"])
    for order in (list(reversed(range(n))), data.draw(st.permutations(range(n)), label="order")):
        permuted = GroupIn.model_validate({**case.doc, "rollouts": [case.doc["rollouts"][i] for i in order]})
        _, adv = score(case, group=permuted)
        assert [r.rollout_id for r in adv.rollouts] == [f"r{i}" for i in order]
        assert math.isclose(adv.stats.mu_rg, reference.stats.mu_rg, abs_tol=1e-12)
        assert math.isclose(adv.stats.sigma_rg, reference.stats.sigma_rg, abs_tol=1e-12)
        for r in adv.rollouts:
            ref = by_id[r.rollout_id]
            assert abs(r.outcome_advantage - ref.outcome_advantage) <= 1e-12
            assert len(r.turns) == len(ref.turns)
            for t, u in zip(r.turns, ref.turns, strict=True):
                assert (t.index, t.type, t.credit) == (u.index, u.type, u.credit)
                assert abs(t.advantage - u.advantage) <= 1e-12
                if t.process_advantage is None or u.process_advantage is None:
                    assert t.process_advantage is u.process_advantage is None
                else:
                    assert abs(t.process_advantage - u.process_advantage) <= 1e-12


@SETTINGS
@given(CASES)
def test_credits_lie_in_zero_to_cap_and_only_the_answer_has_none(case: Case) -> None:
    credits, adv = score(case)
    cap = case.params.cap
    for rc, ra, rollout in zip(credits, adv.rollouts, case.group.rollouts, strict=True):
        assert rc.rollout_id == ra.rollout_id == rollout.id
        assert [t.index for t in rc.turns] == list(range(len(rollout.turns)))
        final = len(rollout.turns) - 1 if rollout.turns and rollout.turns[-1].type == "answer" else None
        for t, a, turn in zip(rc.turns, ra.turns, rollout.turns, strict=True):
            assert t.type == turn.type
            if t.index == final:
                assert t.credit is None and a.process_advantage is None
                assert a.advantage == ra.outcome_advantage
            else:
                assert t.credit is not None and 0.0 <= t.credit <= cap
                assert a.process_advantage is not None
            if turn.type == "tool":
                assert t.credit == 0.0


@SETTINGS
@given(CASES, st.data())
def test_raising_a_visit_level_never_lowers_a_credit(case: Case, data: st.DataObject) -> None:
    """Raising one (visit, rubric) level by one never lowers that visit's credit, nor
    (since navigation sums capped visit credits and saturation only skips snippets once
    the search is at the cap) the credit of any other turn."""
    raisable = sorted(k for k, level in case.judgments.visit_levels.items() if level < 2)
    if not raisable:
        return
    key = data.draw(st.sampled_from(raisable), label="raised")
    raised = Judgments(
        {**case.judgments.visit_levels, key: case.judgments.visit_levels[key] + 1}, case.judgments.snippet_matches
    )
    before, _ = score(case)
    after, _ = score(case, judgments=raised)
    rid, turn_index, _ = key
    for b, a in zip(before, after, strict=True):
        for tb, ta in zip(b.turns, a.turns, strict=True):
            if tb.credit is None:
                assert ta.credit is None
                continue
            assert ta.credit is not None
            assert ta.credit >= tb.credit
            if (b.rollout_id, tb.index) == (rid, turn_index):
                assert ta.visit_credit_uncapped is not None and tb.visit_credit_uncapped is not None
                assert ta.visit_credit_uncapped >= tb.visit_credit_uncapped


@SETTINGS
@given(CASES)
def test_a_rollouts_outline_plans_and_scores_exactly_as_the_rollout(case: Case) -> None:
    """Aggregation and replay score outlines (the text taken out): every credit part,
    advantage and planned call must be the same as from the full rollouts."""
    outlined = GroupIn.model_validate(
        {
            **case.doc,
            "rollouts": [
                {
                    "id": r.id,
                    "outcome_reward": r.outcome_reward,
                    "turns": outline_turns(r.model_dump(mode="json")["turns"]),
                }
                for r in case.group.rollouts
            ],
        }
    )
    credits, adv = score(case)
    outline_credits, outline_adv = score(case, group=outlined)
    assert outline_credits == credits
    assert outline_adv == adv
    for full, short in zip(case.group.rollouts, outlined.rollouts, strict=True):
        plan, outline_plan = plan_rollout(case.group, full, case.params), plan_rollout(outlined, short, case.params)
        assert outline_plan.chains == plan.chains
        assert outline_plan.deterministic_zero_visits == plan.deterministic_zero_visits
        assert [
            (t.turn_index, t.navigation_visits, [r.id for r in t.eligible]) for t in outline_plan.snippet_tasks
        ] == [(t.turn_index, t.navigation_visits, [r.id for r in t.eligible]) for t in plan.snippet_tasks]
