"""Ids the tools printed are kept; collisions are resolved so a report's citations still name the
page the agent last saw under that id; a search that says it failed is a failed search.

The rule under test (``drcredit.trainers.tool_ids``): a printed id is kept; an entry without one
gets the first free ``S<n>`` / ``W<n>`` in turn order; an id printed more than once is kept by
its latest usable page (else its latest), the other occurrences get free ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from drcredit.client import DrCreditClient
from drcredit.domain.group import Rollout
from drcredit.domain.outcome import report_facts
from drcredit.trainers import from_chat_messages, from_react_text
from drcredit.trainers.scoring import TokenRollout, score_token_rollouts
from drcredit.trainers.segments import record_from_tokens
from tests.support.builders import rubric
from tests.support.judge_server import marker_script, running_judge
from tests.support.judged_service import judged_service

A, B, C = "https://a.org/report", "https://b.org/news", "https://c.org/blog"


def chat(*steps: tuple[str, dict[str, Any], Any], report: str | None = None) -> list[dict[str, Any]]:
    """A conversation: one assistant message per (tool, arguments, response), then the report."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "question"}]
    for k, (name, arguments, response) in enumerate(steps):
        call = {"id": f"c{k}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        messages.append({"role": "assistant", "content": f"step {k}", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": response})
    if report is not None:
        messages.append({"role": "assistant", "content": f"<answer>{report}</answer>"})
    return messages


def visit(urls: list[str], pages: list[dict[str, Any]]) -> tuple[str, dict[str, Any], Any]:
    return ("web_visit", {"urls": urls, "goal": "facts"}, json.dumps({"pages": pages}))


def page_ids(rollout: dict[str, Any]) -> list[list[str]]:
    return [[p["id"] for p in t["pages"]] for t in rollout["turns"] if t["type"] == "visit"]


def test_printed_ids_are_kept_and_unprinted_pages_get_free_ones() -> None:
    rollout = from_chat_messages(
        chat(
            visit([A, B], [{"id": "W101", "url": A, "evidence": "a"}, {"id": "W7", "url": B, "evidence": "b"}]),
            visit([C], [{"url": C, "evidence": "c"}]),  # no id printed: the first free W<n>
            (
                "web_search",
                {"queries": ["q"]},
                json.dumps({"results": [{"id": "S40", "url": A}, {"url": B}]}),
            ),
        ),
        rollout_id="r",
    )
    assert page_ids(rollout) == [["W101", "W7"], ["W1"]]
    assert [r["id"] for r in rollout["turns"][2]["results"]] == ["S40", "S1"]


def test_each_text_format_carries_its_printed_id() -> None:
    xml = '<webpage id="W12" url="https://a.org/report"><evidence>a</evidence></webpage>'
    text = f"[W13] URL: {A}\nEvidence: a\n\n## [W14] Second page {B}\nEvidence: b\n"
    keyed = f"URL: {A}\nID: W15\nEvidence: a\nId: not an id line once the evidence runs\n"
    rollout = from_chat_messages(
        chat(
            ("web_visit", {"urls": [A], "goal": "g"}, xml),
            ("web_visit", {"urls": [A, B], "goal": "g"}, text),
            ("web_visit", {"urls": [A], "goal": "g"}, keyed),
            ("web_visit", {"urls": [A], "goal": "g"}, json.dumps({"id": 16, "url": A, "evidence": "a"})),
        ),
        rollout_id="r",
    )
    assert page_ids(rollout) == [["W12"], ["W13", "W14"], ["W15"], ["16"]]
    assert rollout["turns"][2]["pages"][0]["evidence"] == "a\nId: not an id line once the evidence runs"


def test_an_id_printed_twice_is_kept_by_its_latest_page() -> None:
    """A tool numbering each call from W1: the second call's W1 keeps the id, and the first
    call's W1 takes the first id no page printed (W1 to W3 are printed: W4)."""
    rollout = from_chat_messages(
        chat(
            visit([A, B], [{"id": "W1", "url": A, "evidence": "a"}, {"id": "W2", "url": B, "evidence": "b"}]),
            visit([C, B], [{"id": "W1", "url": C, "evidence": "c"}, {"id": "W3", "url": B, "evidence": "b"}]),
        ),
        rollout_id="r",
    )
    assert page_ids(rollout) == [["W4", "W2"], ["W1", "W3"]]
    Rollout.model_validate(rollout)


def test_a_failed_page_does_not_take_an_id_from_a_usable_one() -> None:
    """The latest *usable* page keeps the id; with none usable, the latest."""
    rollout = from_chat_messages(
        chat(
            visit([A], [{"id": "W5", "url": A, "evidence": "a"}]),
            visit([A], [{"id": "W5", "url": A, "error": "HTTP 503"}]),  # the same page again, failed
            visit([B], [{"id": "W6", "url": B, "error": "timeout"}]),
            visit([C], [{"id": "W6", "url": C, "error": "HTTP 404"}]),
        ),
        rollout_id="r",
    )
    assert page_ids(rollout) == [["W5"], ["W1"], ["W2"], ["W6"]]


def test_ids_are_kept_in_react_text_and_token_logs() -> None:
    call = '<tool_call>{"name": "visit", "arguments": {"urls": ["https://a.org/report"], "goal": "g"}}</tool_call>'
    answer = (
        '<tool_response>{"pages": [{"id": "W101", "url": "https://a.org/report", "evidence": "a"}]}</tool_response>'
    )
    react = from_react_text(f"{call}{answer}<answer>done</answer>", rollout_id="r")
    assert page_ids(react) == [["W101"]]
    # the same as tokens (one character per token): a generation, the tool's answer, the report
    text = f"{call}{answer}<answer>done</answer>"
    mask = [1] * len(call) + [0] * len(answer) + [1] * len("<answer>done</answer>")
    record = record_from_tokens(list(range(len(text))), mask, lambda ids: "".join(text[i] for i in ids))
    assert record["error"] is None and [[p["id"] for p in record["turns"][0]["pages"]]] == [["W101"]]


def test_the_report_cites_what_the_agent_saw() -> None:
    """The service's own citation reading: the report's W1 resolves to the latest W1 (C), its W101
    to the W101 the tool printed, and the renamed earlier W1 (now W2) is cited by nobody."""
    report = '# R\n## S\n<cite id="W1">c says so</cite> and <cite id="W101">a says so</cite>.'
    rollout = from_chat_messages(
        chat(
            visit([A], [{"id": "W101", "url": A, "evidence": "a"}]),
            visit([B], [{"id": "W1", "url": B, "evidence": "b"}]),
            visit([C], [{"id": "W1", "url": C, "evidence": "c"}]),
            report=report,
        ),
        rollout_id="r",
    )
    assert rollout["turns"][-1]["answer"] == report  # never rewritten
    pages = {p["id"]: p["url"] for t in rollout["turns"] if t["type"] == "visit" for p in t["pages"]}
    assert pages == {"W101": A, "W2": B, "W1": C}
    facts = report_facts(Rollout.model_validate(rollout))
    assert [(c.claim, c.pages) for c in facts.citations] == [("c says so", ("W1",)), ("a says so", ("W101",))]


def test_a_cited_page_reaches_the_citation_judge(tmp_path: Path) -> None:
    """End to end: converted rollouts scored with judged outcomes by the real service; the
    citation judge is given, for each claim, the page the agent saw under the cited id."""
    rows = []
    for i, (first, second) in enumerate([(A, B), (B, A)]):
        report = '# R\n## S\n<cite id="W1">The fitting failed.</cite>'
        rollout = from_chat_messages(
            chat(
                visit([first], [{"id": "W1", "url": first, "evidence": f"text of {first}"}]),
                visit([second], [{"id": "W1", "url": second, "evidence": f"text of {second} [support=2]"}]),
                report=report,
            ),
            rollout_id=f"r{i}",
        )
        rows.append(TokenRollout("q", f"r{i}", "Why?", [rubric("R1")], rollout["turns"], [(0, 1)] * 3, [1], None))
    with (
        running_judge(marker_script) as judge,
        judged_service(f"sqlite:///{tmp_path / 'c.sqlite3'}", judge.url) as url,
        DrCreditClient(url) as client,
    ):
        scored = score_token_rollouts(rows, client=client, timeout_s=60, params={"outcome_source": "judge"})
        credits = client.credits(scored.group_ids[0], wait=30)
    cited = sorted(p["url"] for c in judge.calls if c.kind == "citation" for p in c.document["cited_pages"])
    assert cited == [A, B]  # r0 cites its second page (B), r1 its second (A)
    for rollout in credits["rollouts"]:
        [claim] = rollout["outcome"]["claims"]
        assert claim["resolving"] == ["W1"] and claim["joint"] == 2  # the [support=2] page: the latest W1


@pytest.mark.parametrize(
    ("response", "results", "error"),
    [
        ({"error": "rate limited", "results": []}, 0, "rate limited"),
        ({"error": "", "results": []}, 0, None),  # no error named: an empty search
        ({"error": None, "results": []}, 0, None),
        (
            [{"query": "a", "error": "timeout", "results": []}, {"query": "b", "error": "HTTP 500"}],
            0,
            "timeout; HTTP 500",
        ),
        ([{"query": "a", "error": "timeout"}, {"query": "b", "results": [{"url": "https://a.org"}]}], 1, None),
        ({"error": "one query failed", "results": [{"url": "https://a.org"}]}, 1, None),
    ],
)
def test_a_search_that_names_an_error_and_returns_nothing_failed(
    response: Any, results: int, error: str | None
) -> None:
    rollout = from_chat_messages(chat(("web_search", {"queries": ["q"]}, json.dumps(response))), rollout_id="r")
    [turn] = rollout["turns"]
    assert len(turn["results"]) == results and turn["error"] == error


def test_a_visit_that_names_an_error_and_returns_no_page_failed() -> None:
    rollout = from_chat_messages(
        chat(("web_visit", {"urls": [A, B], "goal": "g"}, json.dumps({"error": "blocked", "pages": []}))),
        rollout_id="r",
    )
    assert [(p["url"], p["error"], p["evidence"]) for p in rollout["turns"][0]["pages"]] == [
        (A, "blocked", ""),
        (B, "blocked", ""),
    ]
