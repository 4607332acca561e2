"""Input validation: every violation names the path of the offending field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from drcredit.domain.errors import errors_from_pydantic
from drcredit.domain.group import GroupIn
from drcredit.domain.params import ScoringParams
from tests.support.builders import answer, group_doc, page, rollout, rubric, search, visit


def problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(ValidationError) as info:
        GroupIn.model_validate(doc)
    return [str(p) for p in errors_from_pydantic(info.value.errors())]


def ok_rollouts() -> list[dict[str, Any]]:
    return [rollout("a", search(("S1", "u")), answer()), rollout("b", answer())]


def test_valid_group_passes() -> None:
    g = GroupIn.model_validate(group_doc(*ok_rollouts()))
    assert [r.id for r in g.rollouts] == ["a", "b"]


def test_fewer_than_two_rollouts() -> None:
    assert problems(group_doc(rollout("a", answer()))) == [
        "rollouts: a group needs at least 2 rollouts, got 1 (or set expected_rollouts to stream them)"
    ]


def test_no_positive_weight_rubric() -> None:
    got = problems(group_doc(*ok_rollouts(), rubrics=[rubric("P", weight=-1.0), rubric("Z", weight=0.0)]))
    assert got == ["rubrics: no rubric has a positive weight; process credit needs at least one"]


def test_duplicate_ids() -> None:
    doc = group_doc(
        rollout("a", search(("S1", "u"), ("S1", "v")), visit(page("W1", "u")), visit(page("W2", "u"), page("W1", "v"))),
        rollout("a", answer()),
        rubrics=[rubric("R1"), rubric("R1")],
    )
    got = problems(doc)
    assert "rollouts[0].turns[0].results[1].id: duplicate result id S1 (first at turns[0].results[0].id)" in got
    assert "rollouts[0].turns[2].pages[1].id: duplicate page id W1 (first at turns[1].pages[0].id)" in got
    assert "rubrics[1].id: duplicate rubric id R1 (first at rubrics[0])" in got
    # Rollout-level checks run once every rollout is itself valid.
    assert problems(group_doc(rollout("a", answer()), rollout("a", answer()))) == [
        "rollouts[1].id: duplicate rollout id a (first at rollouts[0])"
    ]


def test_answer_turn_must_be_last() -> None:
    got = problems(group_doc(rollout("a", answer(), search(("S1", "u"))), rollout("b", answer())))
    assert got == ["rollouts[0].turns[0].type: an answer turn must be the last turn (found at 0 of 2)"]


def test_non_finite_numbers() -> None:
    doc = json.loads(json.dumps(group_doc(*ok_rollouts())))
    doc["rollouts"][1]["outcome_reward"] = float("nan")
    doc["rubrics"][0]["weight"] = float("inf")
    got = problems(doc)
    assert any(p.startswith("rollouts[1].outcome_reward: must be a finite number") for p in got)
    assert any(p.startswith("rubrics[0].weight: must be a finite number") for p in got)


def test_unknown_and_out_of_range_parameters() -> None:
    got = problems(
        group_doc(
            *ok_rollouts(),
            params={
                "cap": 0,
                "discount": 1.5,
                "gamma": 0.9,
                "attribution": "first",
                "history": "yes",
                "visit_levels": [0, 0.2],
            },
        )
    )
    fields = {p.split(":")[0] for p in got}
    assert fields == {
        "params.cap",
        "params.discount",
        "params.gamma",
        "params.attribution",
        "params.history",
        "params.visit_levels",
    }
    assert "params.gamma: unknown field" in got
    assert (
        "params.visit_levels: must have 3 values (the credit of no, partial and full new support), got 2: [0, 0.2]"
        in got
    )


def test_visit_levels_must_be_non_decreasing() -> None:
    with pytest.raises(ValidationError, match="non-decreasing"):
        ScoringParams.model_validate({"visit_levels": [0, 0.5, 0.2]})


def test_missing_outcome_reward_when_others_have_one() -> None:
    got = problems(group_doc(rollout("a", answer(), reward=0.3), rollout("b", answer(), reward=None)))
    assert got == [
        "rollouts[1].outcome_reward: missing; every rollout of the group needs an outcome_reward when any has one"
    ]


def test_turn_field_errors_name_the_path_without_union_tags() -> None:
    doc = group_doc(rollout("a", visit({"id": "W1", "url": 3}, urls=["u"])), rollout("b", answer()))
    got = problems(doc)
    assert got[0].startswith("rollouts[0].turns[0].pages[0].url: Input should be a valid string")


def test_unknown_turn_type() -> None:
    got = problems(group_doc(rollout("a", {"type": "browse"}), rollout("b", answer())))
    assert got[0] == "rollouts[0].turns[0].type: must be one of search, visit, answer, tool (got 'browse')"


def test_group_id_pattern() -> None:
    got = problems(group_doc(*ok_rollouts(), group_id="bad id/with slash"))
    assert got[0] == (
        "group_id: must be 1-128 characters, each a letter, digit, '-', '_', '.' or ':' (got 'bad id/with slash')"
    )


def test_streaming_group_may_open_with_fewer_rollouts() -> None:
    g = GroupIn.model_validate(group_doc(expected_rollouts=4))
    assert g.rollouts == [] and g.expected_rollouts == 4
    assert problems(group_doc(*ok_rollouts(), rollout("c", answer()), expected_rollouts=2))[0].startswith(
        "rollouts: 3 rollouts exceed expected_rollouts=2"
    )
