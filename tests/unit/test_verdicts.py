"""Validation of the judge's answers (docs/method.md, "Visit credit" and "Search credit"), one test per rule."""

from __future__ import annotations

import pytest

from drcredit.domain.verdicts import InvalidAnswer, accept_snippet_matches, validate_visit_answer
from drcredit.judges.base import parse_json_answer

USABLE = ["W1", "W2"]


def test_level_zero_ignores_page_ids_and_points() -> None:
    v = validate_visit_answer({"level": 0, "page_ids": ["W1"], "support_points": ["x"], "rationale": "r"}, USABLE)
    assert (v.level, v.page_ids, v.support_points) == (0, (), ())


@pytest.mark.parametrize("level", [3, -1, 1.5, "1", None, True])
def test_level_must_be_0_1_or_2(level: object) -> None:
    with pytest.raises(InvalidAnswer, match="level"):
        validate_visit_answer({"level": level, "page_ids": ["W1"], "support_points": ["x"]}, USABLE)


def test_unknown_page_ids_are_dropped_but_one_must_remain() -> None:
    v = validate_visit_answer({"level": 2, "page_ids": ["W9", "W2"], "support_points": ["p"]}, USABLE)
    assert v.page_ids == ("W2",)
    with pytest.raises(InvalidAnswer, match="no usable page"):
        validate_visit_answer({"level": 1, "page_ids": ["W9"], "support_points": ["p"]}, USABLE)
    with pytest.raises(InvalidAnswer):
        validate_visit_answer({"level": 1, "page_ids": [], "support_points": ["p"]}, USABLE)


def test_failed_page_ids_are_not_usable() -> None:
    with pytest.raises(InvalidAnswer):
        validate_visit_answer({"level": 1, "page_ids": ["W3"], "support_points": ["p"]}, ["W1"])


@pytest.mark.parametrize("points", [[], ["  "], ["ok", ""], "a string", None, [1]])
def test_support_points_must_be_non_blank_strings(points: object) -> None:
    with pytest.raises(InvalidAnswer):
        validate_visit_answer({"level": 2, "page_ids": ["W1"], "support_points": points}, USABLE)


def test_more_than_three_support_points_keep_the_first_three() -> None:
    v = validate_visit_answer({"level": 1, "page_ids": ["W1"], "support_points": ["a", "b", "c", "d"]}, USABLE)
    assert v.support_points == ("a", "b", "c")


def test_answer_must_be_an_object() -> None:
    with pytest.raises(InvalidAnswer):
        validate_visit_answer([1, 2], USABLE)


# ----------------------------------------------------------------------------- snippets

SNIPPETS = {"S1": "The plant   opened in 2019 and\nemploys 300 people.", "S2": "Output rose 12% in 2021."}
RUBRICS = ["R1", "R2", "R3"]


def accepted(matches: list[object], rubrics: list[str] = RUBRICS) -> list[tuple[str, str]]:
    verdict = accept_snippet_matches({"matches": matches}, rubrics, SNIPPETS)
    return [(m.rubric_id, m.result_id) for m in verdict.accepted]


def m(rubric: str, result: str, quote: str) -> dict[str, str]:
    return {"rubric_id": rubric, "result_id": result, "evidence_quote": quote}


def test_a_literal_quote_is_accepted_with_whitespace_collapsed() -> None:
    assert accepted([m("R1", "S1", "opened in 2019 and employs 300 people.")]) == [("R1", "S1")]
    assert accepted([m("R1", "S1", "  plant opened\tin 2019  ")]) == [("R1", "S1")]


def test_rubric_must_be_a_positive_weight_rubric() -> None:
    assert accepted([m("PEN", "S1", "opened in 2019")]) == []
    assert accepted([m("R9", "S1", "opened in 2019")]) == []


def test_result_must_be_eligible() -> None:
    assert accepted([m("R1", "S7", "opened in 2019")]) == []


def test_quote_must_be_a_non_empty_substring_of_that_snippet() -> None:
    assert accepted([m("R1", "S1", "opened in 2020")]) == []
    assert accepted([m("R1", "S2", "opened in 2019")]) == []  # in S1, not in S2
    assert accepted([m("R1", "S1", "   ")]) == []
    assert accepted([m("R1", "S1", "OPENED in 2019")]) == []  # case matters


def test_each_rubric_matches_at_most_once_and_earlier_wins() -> None:
    assert accepted([m("R1", "S2", "Output rose 12%"), m("R1", "S1", "opened in 2019")]) == [("R1", "S2")]


def test_one_quote_cannot_serve_two_rubrics() -> None:
    got = accepted(
        [m("R1", "S1", "opened in 2019"), m("R2", "S1", "opened  in 2019"), m("R3", "S1", "employs 300 people")]
    )
    assert got == [("R1", "S1"), ("R3", "S1")]


def test_malformed_entries_are_rejected_alone_with_a_reason() -> None:
    verdict = accept_snippet_matches(
        {"matches": ["junk", {"rubric_id": "R1"}, m("R2", "S2", "rose 12%")]}, RUBRICS, SNIPPETS
    )
    assert [x.rubric_id for x in verdict.accepted] == ["R2"]
    assert [r.index for r in verdict.rejected] == [0, 1]


def test_answer_without_a_matches_list_is_invalid() -> None:
    with pytest.raises(InvalidAnswer):
        accept_snippet_matches({"match": []}, RUBRICS, SNIPPETS)


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text",
    [
        '{"level": 1}',
        '```json\n{"level": 1}\n```',
        'Here is my answer:\n```\n{"level": 1}\n```\nThanks',
        'I think {"level": 1} is right.',
    ],
)
def test_json_is_found_bare_fenced_or_in_prose(text: str) -> None:
    assert parse_json_answer(text) == {"level": 1}


@pytest.mark.parametrize("text", ['{"level": 1', "level two", "[1, 2]", ""])
def test_malformed_json_is_never_repaired_into_an_answer(text: str) -> None:
    with pytest.raises(InvalidAnswer):
        parse_json_answer(text)
