"""One test per rule of the outcome reward (docs/method.md, "Outcome reward"), numbers worked out by hand."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from drcredit.domain.group import GroupIn, Rubric
from drcredit.domain.outcome import (
    JOINT,
    ReportFacts,
    citation_calls,
    citation_matches,
    claim_score,
    heading_levels,
    judged_rubrics,
    outcome_breakdown,
    parse_citations,
    report_facts,
)
from drcredit.domain.params import OutcomeWeights, ScoringParams
from tests.support.builders import group, page, rollout, rubric, search, visit

W = OutcomeWeights().model_dump()


def answer(text: str, reasoning: str = "write") -> dict[str, Any]:
    return {"type": "answer", "reasoning": reasoning, "answer": text}


def one(*turns: dict[str, Any], rubrics: list[dict[str, Any]] | None = None) -> GroupIn:
    return group(rollout("a", *turns, reward=None), rollout("b", reward=None), rubrics=rubrics)


def rubs(g: GroupIn) -> list[Rubric]:
    return list(g.rubrics)


def test_rubric_satisfaction_weighs_scores_and_a_satisfied_penalty_lowers_it() -> None:
    """R1 w2 score 4, R2 w1 score 2, P w-1 score 4, Z w0 not judged:
    (2 x 4/4 + 1 x 2/4 - 1 x 4/4) / (2 + 1) = 1.5 / 3 = 0.5."""
    g = one(answer("report"), rubrics=[rubric("R1", 2.0), rubric("R2", 1.0), rubric("P", -1.0), rubric("Z", 0.0)])
    assert [r.id for r in judged_rubrics(g.rubrics)] == ["R1", "R2", "P"]
    facts = report_facts(g.rollouts[0])
    b = outcome_breakdown(facts, rubs(g), {"R1": 4, "R2": 2, "P": 4}, {}, W, 5, 2000, exclude=False)
    assert b.rubric == pytest.approx(0.5)


def test_rubric_satisfaction_is_not_clipped_below_zero() -> None:
    """R1 w1 score 0, P w-3 score 4: (0 - 3) / 1 = -3."""
    g = one(answer("report"), rubrics=[rubric("R1", 1.0), rubric("P", -3.0)])
    b = outcome_breakdown(report_facts(g.rollouts[0]), rubs(g), {"R1": 0, "P": 4}, {}, W, 5, 2000, exclude=False)
    assert b.rubric == pytest.approx(-3.0)


def test_citations_are_found_left_to_right_without_overlap_and_the_rest_is_malformed() -> None:
    """The first opening tag's span would hold a second '<cite': no match there; the inner
    citation matches; the stray opening and a lone closing tag are 2 malformed markups."""
    report = 'A <cite id="W1">x <cite id="W2">inner  claim</cite> and </cite> end <cite id="W1">second</cite>'
    citations, malformed = parse_citations(report, {"W1", "W2"})
    assert [c.claim for c in citations] == ["inner claim", "second"]
    assert [c.references for c in citations] == [("W2",), ("W1",)]
    assert malformed == 2


#: Texts made of citations and near misses of their markup, where a fast scan could go wrong.
CITATION = st.builds(
    '<cite id="{}">{}</cite>'.format,
    st.sampled_from(["W1", "W1, S2", ""]),
    st.sampled_from(["claim", " a \t b ", "", "a\u00a0\u2028b\x1c"]),
)
NEAR_MISS = st.sampled_from(['<cite id="', "<cite", '">', '"', ">", "</cite>", "</cite", "W1", " ", "\n", "x", "<"])
MARKUP = st.lists(st.one_of(CITATION, NEAR_MISS), max_size=30).map("".join)


@given(MARKUP)
def test_citations_are_found_exactly_where_the_rule_finds_them(text: str) -> None:
    """The scan for citations matches the rule written as one regular expression, applied at
    every position, and the length term's text (each citation replaced by its span) too."""
    rule = re.compile(r'<cite id="([^"]*)">((?:(?!<cite|</cite>).)*)</cite>', re.DOTALL)
    expected = [(m.span(), m.groups()) for m in rule.finditer(text)]
    assert [(m.span(), m.groups()) for m in citation_matches(text)] == expected
    claims = [re.sub(r"\s+", " ", span).strip() for _, (_, span) in expected]
    assert [c.claim for c in parse_citations(text, set())[0]] == claims
    g = one(visit(page("W1", "u1")), answer("r " + text))
    assert report_facts(g.rollouts[0]).words == len(rule.sub(lambda m: m.group(2), "r " + text).split())


def test_references_are_split_on_commas_and_checked_for_form_and_resolution() -> None:
    """IDS ' W1, ,S1,12, W9 ,x-1,w2': references W1 S1 12 W9 x-1 w2; well-formed W1 S1 W9 w2;
    resolving (usable pages W1 w2; S1 is a search result, W9 no page): W1 w2 -> r_id 2/4."""
    citations, _ = parse_citations('<cite id=" W1, ,S1,12, W9 ,x-1,w2">claim</cite>', {"W1", "w2"})
    c = citations[0]
    assert c.references == ("W1", "S1", "12", "W9", "x-1", "w2")
    assert c.well_formed == (True, True, False, True, False, True)
    assert c.pages == ("W1", "w2")


def test_only_usable_pages_of_the_rollouts_visits_resolve() -> None:
    """W1 usable, W2 failed, W3 blank evidence: only W1 resolves."""
    g = one(
        visit(page("W1", "u1"), page("W2", "u2", error="404"), page("W3", "u3", evidence="  ")),
        answer('# A\n## B\n<cite id="W1,W2,W3">claim</cite>'),
    )
    facts = report_facts(g.rollouts[0])
    assert facts.citations[0].pages == ("W1",)
    b = outcome_breakdown(facts, rubs(g), {"R1": 0}, {(0, JOINT): 2}, W, 5, 2000, exclude=False)
    assert b.r_id == pytest.approx(1 / 3)


def test_claim_score_is_the_harmonic_mean_of_joint_and_page_support() -> None:
    """j 2, pages (2, 0): a 1, b 0.5 -> 2 x 0.5 / 1.5 = 2/3. j 0 and no page >= 1: 0."""
    assert claim_score(2, [2, 0]) == pytest.approx(2 / 3)
    assert claim_score(0, [0, 0]) == 0.0
    assert claim_score(1, [1]) == pytest.approx(2 * 0.5 * 1 / 1.5)


def test_a_claim_with_one_page_makes_one_call_and_its_page_score_is_the_joint_score() -> None:
    """One page, j 1: s = j = 1 -> a 0.5, b 1 -> 2/3; two pages make 1 + 2 calls."""
    g = one(
        visit(page("W1", "u1"), page("W2", "u2")),
        answer('<cite id="W1">one page</cite> <cite id="W1, W2, W1">two pages</cite>'),
    )
    facts = report_facts(g.rollouts[0])
    assert [citation_calls(c) for c in facts.citations] == [[JOINT], [JOINT, "W1", "W2"]]
    scores = {(0, JOINT): 1, (1, JOINT): 2, (1, "W1"): 2, (1, "W2"): 1}
    b = outcome_breakdown(facts, rubs(g), {"R1": 0}, scores, W, 5, 2000, exclude=False)
    assert [c.score for c in b.claims] == [pytest.approx(2 / 3), pytest.approx(1.0)]
    assert b.r_semantic == pytest.approx((2 / 3 + 1) / 2)


def test_unscoreable_claims_score_zero_and_failed_claims_are_left_out() -> None:
    """Claims: '(1)' has no letter or digit... '1' has one; claim 0 '--' is unscoreable (0);
    claim 1 cites no resolving page (0); claim 2's call failed (left out); claim 3 j 2 (1.0).
    r_semantic = (0 + 0 + 1) / 3; r_id = 3 resolving / 4 well-formed."""
    g = one(
        visit(page("W1", "u1")),
        answer('<cite id="W1">--</cite><cite id="W7">no page</cite><cite id="W1">failed</cite><cite id="W1">ok</cite>'),
    )
    facts = report_facts(g.rollouts[0])
    assert [c.scoreable for c in facts.citations] == [False, False, True, True]
    b = outcome_breakdown(facts, rubs(g), {"R1": 0}, {(2, JOINT): None, (3, JOINT): 2}, W, 5, 2000, exclude=False)
    assert [c.note for c in b.claims] == ["unscoreable", "unscoreable", "failed", None]
    assert b.r_semantic == pytest.approx(1 / 3)
    assert b.r_id == pytest.approx(3 / 4)
    assert b.cite == pytest.approx(0.4 * 0.75 + 0.6 / 3)


def test_no_citation_gives_zero_citation_reward() -> None:
    g = one(answer("# Plain\n## report without citations"))
    b = outcome_breakdown(report_facts(g.rollouts[0]), rubs(g), {"R1": 4}, {}, W, 5, 2000, exclude=False)
    assert (b.r_id, b.r_semantic, b.cite) == (0.0, 0.0, 0.0)


@given(
    st.lists(
        st.sampled_from(["# x", "### y", "####### z", "#x", "#", " ", "\n", "\r", "\x0b", "\t", "x", "\u00a0"]),
        max_size=30,
    ).map("".join)
)
def test_headings_are_found_exactly_where_the_rule_finds_them(text: str) -> None:
    """Line by line, the same headings as the rule written as one multi-line regex."""
    rule = re.compile(r"^(#{1,6}) +\S", re.MULTILINE)
    assert heading_levels(text) == [len(m.group(1)) for m in rule.finditer(text)]


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("# Title\n## Part\ntext", True),
        ("# Title\n# Again\ntext", False),  # one level only
        ("# Title only", False),
        ("#Title\n## Part", False),  # no space after the marks
        ("####### Seven\n## Part", False),  # seven marks is no heading
        ("  # Indented\n## Part", False),
        ("## A\n### B", True),
    ],
)
def test_format_check_answer_needs_two_headings_of_two_levels(text: str, ok: bool) -> None:
    assert report_facts(one(answer(text)).rollouts[0]).format_checks[0] is ok


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('<cite id="W1">claim</cite>', True),
        ("no citation at all", False),
        ('<cite id="W1">claim</cite> stray </cite>', False),  # malformed markup
        ('<cite id="W1">...</cite>', False),  # no letter or digit in the span
        ('<cite id="W1, page-2">claim</cite>', False),  # a reference that is not well-formed
        ('<cite id="W9">claim</cite>', True),  # well-formed though it resolves nowhere
    ],
)
def test_format_check_citation_markup(text: str, ok: bool) -> None:
    g = one(visit(page("W1", "u1")), answer(text))
    assert report_facts(g.rollouts[0]).format_checks[1] is ok


def test_format_check_tool_calls() -> None:
    good_search = search(("S1", "u"))
    three_queries = {**search(("S2", "u2")), "call": {"queries": ["a", "b", "c"]}}
    blank_query = {**search(("S3", "u3")), "call": {"queries": [" "]}}
    no_goal = {**visit(page("W1", "u1")), "call": {"urls": ["u1"], "goal": ""}}
    assert report_facts(one(good_search, visit(page("W1", "u1")), answer("r")).rollouts[0]).format_checks[2]
    for bad in (three_queries, blank_query, no_goal):
        assert not report_facts(one(bad, answer("r")).rollouts[0]).format_checks[2]
    assert report_facts(one(answer("r")).rollouts[0]).format_checks[2]  # neither kind: true


def test_format_check_reasoning_on_every_turn() -> None:
    assert report_facts(one(search(("S1", "u")), answer("r")).rollouts[0]).format_checks[3]
    assert not report_facts(one(search(("S1", "u")), answer("r", reasoning=" ")).rollouts[0]).format_checks[3]


def test_search_term_counts_searches_without_error_that_have_a_query() -> None:
    """Searches: ok, ok, with error, blank query -> n 2; cap 5 -> 0.4; cap 1 -> 1."""
    blank = {**search(("S4", "u4")), "call": {"queries": [""]}}
    g = one(search(("S1", "u1")), search(("S2", "u2")), search(("S3", "u3"), error="timeout"), blank, answer("r"))
    facts = report_facts(g.rollouts[0])
    assert facts.searches == 2
    assert outcome_breakdown(facts, rubs(g), {"R1": 0}, {}, W, 5, 2000, exclude=False).search == pytest.approx(0.4)
    assert outcome_breakdown(facts, rubs(g), {"R1": 0}, {}, W, 1, 2000, exclude=False).search == 1.0


def test_length_term_counts_words_with_citations_replaced_by_their_span() -> None:
    """'# Title\\n\\nA <cite id="W1">b  c</cite> d' -> #, Title, A, b, c, d: 6 words;
    cap 12 -> 0.5, cap 4 -> 1."""
    g = one(visit(page("W1", "u1")), answer('# Title\n\nA <cite id="W1">b  c</cite> d'))
    facts = report_facts(g.rollouts[0])
    assert facts.words == 6
    assert outcome_breakdown(facts, rubs(g), {"R1": 0}, {}, W, 5, 12, exclude=False).length == pytest.approx(0.5)
    assert outcome_breakdown(facts, rubs(g), {"R1": 0}, {}, W, 5, 4, exclude=False).length == 1.0


@pytest.mark.parametrize("turns", [[answer("   \n ")], [search(("S1", "u"))]])
def test_a_blank_or_missing_report_has_zero_reward_and_no_call(turns: list[dict[str, Any]]) -> None:
    g = one(*turns)
    facts = report_facts(g.rollouts[0])
    assert not facts.has_report
    assert outcome_breakdown(facts, rubs(g), {}, {}, W, 5, 2000, exclude=False).reward == 0.0


def test_the_whole_reward_with_default_weights() -> None:
    """Report: two headings of two levels, one citation of W1 (j 2 -> claim 1.0), 11 words
    (#, Findings, ##, Detail, The, plant, opened, in, 2019, says, report).
    r_rubric = 3/4 = 0.75; format: answer 1, markup 1, tools 1, reasoning 1 -> 1;
    search 1/5 = 0.2; cite 0.4 x 1 + 0.6 x 1 = 1; length 11/2000 = 0.0055.
    r = 0.7 x 0.75 + 0.05 x 1 + 0.05 x 0.2 + 0.15 x 1 + 0.05 x 0.0055 = 0.735275."""
    text = '# Findings\n## Detail\nThe plant opened <cite id="W1">in 2019</cite> says report'
    g = one(search(("S1", "u1")), visit(page("W1", "u1")), answer(text))
    facts = report_facts(g.rollouts[0])
    assert facts.words == 11 and facts.format_checks == (True, True, True, True)
    b = outcome_breakdown(facts, rubs(g), {"R1": 3}, {(0, JOINT): 2}, W, 5, 2000, exclude=False)
    assert b.reward == pytest.approx(0.735275)


def test_custom_weights_and_caps_apply() -> None:
    """weights rubric 1, others 0: r = r_rubric = 0.5 (score 2)."""
    weights = OutcomeWeights(rubric=1, format=0, search=0, cite=0, length=0).model_dump()
    g = one(answer("r"))
    b = outcome_breakdown(report_facts(g.rollouts[0]), rubs(g), {"R1": 2}, {}, weights, 5, 2000, exclude=False)
    assert b.reward == pytest.approx(0.5)


def test_a_failed_rubric_judgment_scores_zero_or_makes_the_reward_null_under_exclude() -> None:
    """R1 failed, R2 score 4 (weights 1, 1): r_rubric = (0 + 1) / 2 under zero; null under exclude."""
    g = one(answer("r"), rubrics=[rubric("R1"), rubric("R2")])
    facts = report_facts(g.rollouts[0])
    zero = outcome_breakdown(facts, rubs(g), {"R1": None, "R2": 4}, {}, W, 5, 2000, exclude=False)
    assert zero.rubric == pytest.approx(0.5) and zero.unscorable and zero.reward is not None
    excluded = outcome_breakdown(facts, rubs(g), {"R1": None, "R2": 4}, {}, W, 5, 2000, exclude=True)
    assert excluded.reward is None and excluded.rubric == pytest.approx(0.5)


def test_outcome_parameters_are_validated() -> None:
    p = ScoringParams.model_validate({"outcome_source": "judge", "outcome_weights": {"cite": 0.3}, "search_cap": 3})
    assert p.outcome_weights.cite == 0.3 and p.outcome_weights.rubric == 0.7 and p.search_cap == 3
    for bad in (
        {"outcome_weights": {"citation": 1}},
        {"outcome_weights": {"rubric": -1}},
        {"search_cap": 0},
        {"length_cap": -5},
        {"outcome_source": "trainer"},
    ):
        with pytest.raises(ValueError):
            ScoringParams.model_validate(bad)


def test_a_given_reward_with_judge_source_is_invalid() -> None:
    with pytest.raises(ValueError, match=r"rollouts\[0\].outcome_reward"):
        group(
            rollout("a", answer("r"), reward=1.0),
            rollout("b", answer("r"), reward=None),
            params={"outcome_source": "judge"},
        )


def test_report_facts_read_back_from_storage_equal_the_report_parsed_again() -> None:
    """Ingest stores a report's facts as JSON and the outcome unit plans its calls from
    them: what is read back must be what parsing the report gives."""
    g = one(
        search(("S1", "https://a.org/1")),
        visit(page("W1", "https://a.org/1", "text"), page("W2", "https://b.org/2", "more")),
        answer(
            '# R\n## Part\nFirst <cite id="W1">a claim</cite>, then <cite id="W1, W2, w3">  two\n pages </cite>'
            ' and <cite id="X9">unknown</cite> <cite id="W2">'
        ),
    )
    facts = report_facts(g.rollouts[0])
    assert len(facts.citations) == 3 and facts.malformed_markup == 1
    assert ReportFacts.from_json(orjson.loads(orjson.dumps(facts.to_json()))) == facts
