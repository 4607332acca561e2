"""Request signatures: which judge requests of a group may be identical (twin turns)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from drcredit.domain.credit import plan_rollout
from drcredit.domain.dedupe import _digest, signatures, twin_turns
from drcredit.domain.group import GroupIn


def stdlib_digest(value: object) -> str:
    """The digest as the standard library's encoder made it before (rows stored by an
    earlier release compare equal to new ones)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


# Valid text only: no lone surrogates (neither encoder can write those as UTF-8).
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(TEXT, st.lists(TEXT, max_size=4), st.none()), max_size=6))
def test_a_digest_is_the_same_bytes_as_the_standard_library_encoding(value: list[Any]) -> None:
    assert _digest(value) == stdlib_digest(value)


def test_control_characters_and_line_separators_digest_alike() -> None:
    value = ["tab\there", "nul\x00 unit\x1f", "line\u2028para\u2029", "é ü 中文 🙂", ['quote " and \\ slash']]
    assert _digest(value) == stdlib_digest(value)


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
    sigs = {r.id: signatures(r, plan_rollout(group, r, group.params)) for r in group.rollouts}
    assert twin_turns(sigs) == {"a": {0}, "b": {0}, "c": set()}
