"""Request signatures: which judge requests of a group may be identical (twin turns)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from drcredit.domain.credit import plan_rollout
from drcredit.domain.dedupe import json_digest, signatures, twin_turns
from drcredit.domain.group import GroupIn
from drcredit.scoring.intake.content import request_digest

# Valid text only: no lone surrogates (neither encoder can write those as UTF-8).
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(TEXT, st.lists(TEXT, max_size=4), st.none()), max_size=6))
def test_the_service_digest_equals_the_domain_reference(value: list[Any]) -> None:
    """Signatures stored by either (an earlier release used the reference) compare equal."""
    assert request_digest(value) == json_digest(value)


def test_control_characters_and_line_separators_digest_alike() -> None:
    value = ["tab\there", "nul\x00 unit\x1f", "line\u2028para\u2029", "é ü 中文 🙂", ['quote " and \\ slash']]
    assert request_digest(value) == json_digest(value)


def visit(urls: list[str], page_id: str, evidence: str, reasoning: str = "look") -> dict[str, Any]:
    return {
        "type": "visit",
        "reasoning": reasoning,
        "call": {"urls": urls, "goal": "find it"},
        "pages": [{"id": page_id, "url": urls[0], "evidence": evidence, "summary": "s"}],
    }


def test_the_same_visit_in_two_rollouts_is_a_twin_and_a_different_one_is_not() -> None:
    answer = {"type": "answer", "reasoning": "done", "answer": "report"}
    group = GroupIn.model_validate(
        {
            "question": "q",
            "rubrics": [{"id": "R1", "type": "factual", "description": "a fact", "weight": 1.0}],
            "rollouts": [
                {"id": rid, "outcome_reward": 0.5, "turns": [visit(["https://x.org/1"], "P1", text), answer]}
                for rid, text in [("a", "same page"), ("b", "same page"), ("c", "other text")]
            ],
        }
    )
    for digest in (json_digest, request_digest):
        sigs = {r.id: signatures(r, plan_rollout(group, r, group.params), digest) for r in group.rollouts}
        assert twin_turns(sigs) == {"a": {0}, "b": {0}, "c": set()}
