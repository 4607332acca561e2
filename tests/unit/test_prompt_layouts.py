"""Prompt layouts (what comes first in the judge's user message) and the request digest
that decides which requests are identical (docs/judges.md, "Prompt layouts", "Reuse")."""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest

from drcredit.domain.group import GroupIn
from drcredit.judges.base import CitationJudgeRequest, RubricJudgeRequest, VisitJudgeRequest
from drcredit.judges.openai_judge import OpenAIJudge
from drcredit.judges.outcome_prompts import citation_prompt, rubric_prompt
from drcredit.judges.prompts import LAYOUTS, snippet_prompt, visit_prompt
from drcredit.judges.requests import SnippetJudgeRequest
from drcredit.settings import Settings
from tests.support.builders import group, page, rollout, rubric, search, visit


def _group() -> GroupIn:
    return group(
        rollout(
            "a",
            search(("S1", "https://n.org/1", "It opened in 2019.")),
            visit(page("W1", "https://a.org/x", "The plant opened in 2019."), page("W2", "https://b.org/y", "more")),
        ),
        rollout("b", visit(page("W1", "https://c.org/x", "other"))),
        rubrics=[rubric("R1", trusted=["opened 2019"]), rubric("R2")],
    )


def _visit(rubric_index: int, prior: tuple[str, ...] = ()) -> VisitJudgeRequest:
    g = _group()
    return VisitJudgeRequest(g.question, g.rubrics[rubric_index], prior, g.rollouts[0].turns[1])  # type: ignore[arg-type]


def _keys(user: str) -> list[str]:
    return list(json.loads(user))


def test_the_setting_names_the_layouts_the_prompts_render() -> None:
    assert get_args(Settings.model_fields["judge_prompt_layout"].annotation) == LAYOUTS
    assert Settings().judge_prompt_layout == "shared-first-v1"


def test_shared_first_puts_the_visit_before_the_rubric_and_its_history() -> None:
    prompt = visit_prompt(_visit(0, ("earlier point",)), "shared-first-v1")
    assert _keys(prompt.user) == ["question", "visit", "rubric_item", "support_already_credited", "answer_format"]
    assert prompt.layout == "shared-first-v1"
    old = visit_prompt(_visit(0, ("earlier point",)), "rubric-first-v0")
    assert _keys(old.user) == ["question", "rubric_item", "support_already_credited", "visit", "answer_format"]
    # Only the order differs: the same parts, the same system text.
    assert json.loads(prompt.user) == json.loads(old.user) and prompt.system == old.system


def test_a_visits_rubric_calls_share_everything_up_to_the_rubric() -> None:
    r1, r2 = visit_prompt(_visit(0), "shared-first-v1"), visit_prompt(_visit(1, ("x",)), "shared-first-v1")
    shared = len(_common_prefix(r1.user, r2.user))
    pages = r1.user.index('"rubric_item"')
    # Question, reasoning, call and pages: the same text for both rubrics, up to the rubric's id.
    assert pages <= shared < r1.user.index('"type"', pages)
    assert '"The plant opened in 2019."' in r1.user[:shared]
    v1, v2 = visit_prompt(_visit(0), "rubric-first-v0"), visit_prompt(_visit(1, ("x",)), "rubric-first-v0")
    assert "opened in 2019" not in v1.user[: len(_common_prefix(v1.user, v2.user))]


def test_a_reports_rubric_calls_share_the_report_first() -> None:
    request = RubricJudgeRequest("q?", _group().rubrics[0], "the report")
    assert _keys(rubric_prompt(request, "shared-first-v1").user) == [
        "question",
        "report",
        "rubric_item",
        "answer_format",
    ]
    assert _keys(rubric_prompt(request, "rubric-first-v0").user) == [
        "question",
        "rubric_item",
        "report",
        "answer_format",
    ]
    citation = CitationJudgeRequest("a claim", (("https://a.org", "text"),))
    assert _keys(citation_prompt(citation, "shared-first-v1").user) == ["claim", "cited_pages", "answer_format"]
    g = _group()
    snippets = SnippetJudgeRequest(g.question, tuple(g.rubrics), tuple(g.rollouts[0].turns[0].results))  # type: ignore[union-attr]
    assert _keys(snippet_prompt(snippets, "shared-first-v1").user)[:3] == [
        "question",
        "rubric_items",
        "unopened_results",
    ]


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _judge(**kw: Any) -> OpenAIJudge:
    values: dict[str, Any] = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}
    values.update(kw)
    return OpenAIJudge(**values)


@pytest.mark.parametrize(
    "change",
    [
        {"model": "m2"},
        {"temperature": 0.7},
        {"max_tokens": 2048},
        {"response_format": "json_object"},
        {"extra_body": {"top_p": 0.9}},
        {"extra_body": {"seed": 7}},
        {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
        {"prompt_layout": "rubric-first-v0"},
    ],
)
def test_each_thing_that_reaches_the_judge_changes_the_digest(change: dict[str, Any]) -> None:
    base, changed = _judge(), _judge(**change)
    assert base.request_key(base.visit_prompt(_visit(0))) != changed.request_key(changed.visit_prompt(_visit(0)))


def test_identical_requests_have_one_digest_and_other_messages_another() -> None:
    a, b = _judge(extra_body={"seed": 1, "top_p": 0.5}), _judge(extra_body={"top_p": 0.5, "seed": 1})
    assert a.request_key(a.visit_prompt(_visit(0))) == b.request_key(b.visit_prompt(_visit(0)))
    assert a.request_key(a.visit_prompt(_visit(0))) != a.request_key(a.visit_prompt(_visit(0, ("a point",))))
    assert a.request_key(a.visit_prompt(_visit(0))) != a.request_key(a.visit_prompt(_visit(1)))


def test_an_audit_judge_entry_may_name_its_own_layout() -> None:
    from drcredit.audit.judges import audit_settings

    settings = Settings(
        judge="openai",
        judge_model="m",
        judge_base_url="http://127.0.0.1:9/v1",
        audit_judges={"old": {"prompt_layout": "rubric-first-v0"}, "bad": {"prompt_layout": "x"}},
    )
    assert audit_settings(settings, "old").judge_prompt_layout == "rubric-first-v0"
    with pytest.raises(ValueError, match=r"DRCREDIT_AUDIT_JUDGES\.bad\.prompt_layout"):
        audit_settings(settings, "bad")
