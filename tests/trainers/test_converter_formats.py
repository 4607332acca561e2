"""The tool-output formats the converters read: search results, visited pages, answers and
tool names, each shape to the same turn."""

from __future__ import annotations

import json
from typing import Any

import pytest

from drcredit.trainers import (
    ToolNames,
    from_chat_messages,
)
from tests.trainers.logs import (
    only_turn,
    page,
    result,
    search_call,
    visit_call,
)

# ----------------------------------------------------------------------------- formats


@pytest.mark.parametrize(
    "response",
    [
        json.dumps({"results": [{"url": "https://a.org", "title": "A", "snippet": "a"}, {"href": "https://b.org"}]}),
        [{"link": "https://a.org", "name": "A", "description": "a"}, {"url": "https://b.org", "snippet": None}],
        "Results for 'q':\n[1] A\nhttps://a.org\na\n[2] https://b.org\n",
        "1) A\nLink: https://a.org\nDescription: a\n2) \nURL: <https://b.org>\n",
        "1. [A](https://a.org) a\n\n---\n2. [](https://b.org)\n",
    ],
)
def test_search_formats(response: Any) -> None:
    turn = only_turn(search_call(response))
    assert turn["results"] == [result("S1", "https://a.org", "A", "a"), result("S2", "https://b.org", "", "")]
    assert turn["error"] is None


def test_plain_text_search_with_one_list_per_query() -> None:
    response = (
        "A Google search for 'q1' found 2 results:\n\n## Web Results\n"
        "1. [One](https://one.org)\nfirst\n\n2. [Two](https://two.org)\nsecond\n"
        "=======\nA Google search for 'q2' found 1 results:\n\n## Web Results\n"
        "1. [Three](https://three.org)\nthird line 1\n3. not a new entry\n"
    )
    turn = only_turn(search_call(response, queries=["q1", "q2"]))
    assert turn["results"] == [
        result("S1", "https://one.org", "One", "first"),
        result("S2", "https://two.org", "Two", "second"),
        result("S3", "https://three.org", "Three", "third line 1\n3. not a new entry"),
    ]


@pytest.mark.parametrize(
    ("response", "error"),
    [
        ("No results found for 'q'.", None),
        ("A Google search for 'q' found 0 results", None),
        ("", None),
        ("[]", None),
        (json.dumps({"results": []}), None),
        ("Error: search backend rate limited (HTTP 429)", "Error: search backend rate limited (HTTP 429)"),
        (json.dumps({"error": "quota exceeded"}), "quota exceeded"),
    ],
)
def test_search_without_results(response: str, error: str | None) -> None:
    turn = only_turn(search_call(response))
    assert turn["results"] == [] and turn["error"] == error


@pytest.mark.parametrize(
    ("response", "ids"),
    [
        (
            json.dumps(
                [
                    {"url": "https://a.org", "evidence": "ev a", "summary": "sum a"},
                    {"url": "https://b.org", "error": "404"},
                ]
            ),
            ("W1", "W2"),
        ),
        (
            json.dumps(
                {"pages": [{"evidence": "ev a", "summary": "sum a"}, {"content": "Failed to fetch https://b.org"}]}
            ),
            ("W1", "W2"),
        ),
        (
            '<webpage id="W7" url="https://a.org"><summary>sum a</summary><evidence>ev a</evidence></webpage>\n'
            '<webpage url="https://b.org" error="404"/>',
            ("W7", "W1"),  # the id the tool printed is kept; the page it printed none for gets the first free one
        ),
        (
            "Visited 2 pages:\nURL: https://a.org\nSummary: sum a\nEvidence: ev a\n\nURL: https://b.org\nError: 404\n",
            ("W1", "W2"),
        ),
        (
            "## Page 1: https://a.org\nTitle: A\nEvidence:\nev a\nSummary:\nsum a\n---\n## Page 2: https://b.org\n"
            "HTTP 404 Not Found\n",
            ("W1", "W2"),
        ),
    ],
)
def test_visit_formats(response: str, ids: tuple[str, str]) -> None:
    turn = only_turn(visit_call(response, ["https://a.org", "https://b.org"]))
    assert turn["call"] == {"urls": ["https://a.org", "https://b.org"], "goal": "facts"}
    assert turn["pages"][0] == page(ids[0], "https://a.org", "ev a", "sum a")
    assert turn["pages"][1]["id"] == ids[1] and turn["pages"][1]["url"] == "https://b.org"
    assert turn["pages"][1]["error"] and turn["pages"][1]["evidence"] == ""


def test_visit_text_without_sections_is_the_single_urls_page() -> None:
    turn = only_turn(visit_call("Evidence: ev\nError: handling is described here\nSummary: s", ["https://a.org"]))
    assert turn["pages"] == [page("W1", "https://a.org", "ev\nError: handling is described here", "s")]
    raw = only_turn(visit_call("Raw page text with no keys at all.", ["https://a.org"]))
    assert raw["pages"] == [page("W1", "https://a.org", "Raw page text with no keys at all.")]


@pytest.mark.parametrize(
    ("response", "error"),
    [
        ("Error: the visit tool timed out", "the visit tool timed out"),
        ("Request timed out after 60 s", "Request timed out after 60 s"),
        (json.dumps({"error": "quota exceeded"}), "quota exceeded"),
    ],
)
def test_a_failed_visit_call_fails_every_url(response: str, error: str) -> None:
    turn = only_turn(visit_call(response, ["https://a.org", "https://b.org"]))
    assert turn["pages"] == [page("W1", "https://a.org", "", None, error), page("W2", "https://b.org", "", None, error)]


def test_a_called_url_missing_from_the_response_gets_a_failed_page() -> None:
    turn = only_turn(visit_call("URL: https://b.org\nEvidence: ev b\n", ["https://a.org", "https://www.b.org/"]))
    assert turn["pages"] == [
        page("W1", "https://b.org", "ev b"),
        page("W2", "https://a.org", "", None, "no response for this URL"),
    ]


def test_long_evidence_that_mentions_an_error_is_not_a_failure() -> None:
    evidence = "A 404 Not Found status means the server has no such page. " * 10
    turn = only_turn(visit_call(json.dumps([{"url": "https://a.org", "evidence": evidence}]), ["https://a.org"]))
    assert turn["pages"][0]["error"] is None and turn["pages"][0]["evidence"] == evidence.strip()


def test_answer_variants() -> None:
    def final(content: str, **extra: Any) -> dict[str, Any]:
        messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": content, **extra}]
        return only_turn(messages)

    assert final("Plain report.") == {"type": "answer", "reasoning": "", "answer": "Plain report."}
    assert final("Intro <answer>Report</answer>", reasoning_content="why") == {
        "type": "answer",
        "reasoning": "why\n\nIntro",
        "answer": "Report",
    }
    assert final("<think>t</think><answer>cut off mid")["answer"] == "cut off mid"
    assert final("<answer>one</answer> and <answer>two</answer>")["answer"] == "one\n\ntwo"
    parts = [{"type": "text", "text": "<answer>multi"}, {"type": "text", "text": "part</answer>"}]
    assert final(parts)["answer"] == "multipart"  # type: ignore[arg-type]


def test_tool_messages_without_ids_answer_calls_in_order() -> None:
    messages: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "calc", "arguments": '{"x": 1}'}},
                {"type": "function", "function": {"name": "clock", "arguments": ""}},
            ],
        },
        {"role": "tool", "content": "1"},
        {"role": "tool", "content": {"time": "noon"}},
        {"role": "assistant", "content": "done"},
    ]
    rollout = from_chat_messages(messages, rollout_id="x")
    assert [(t.get("name"), t.get("arguments"), t.get("response")) for t in rollout["turns"]] == [
        ("calc", {"x": 1}, "1"),
        ("clock", {}, {"time": "noon"}),
        (None, None, None),
    ]


def test_a_truncated_search_has_no_results_and_says_why() -> None:
    messages = search_call("unused")[:2]
    assert only_turn(messages) == {
        "type": "search",
        "reasoning": "look",
        "call": {"queries": ["q"]},
        "results": [],
        "error": "no response",
    }


def test_tool_names_accept_single_strings_and_reject_overlap() -> None:
    # A bare string is a common slip; it must not match the tool name's single characters.
    assert ToolNames(search="s", visit="v").search == ("s",)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="both search and visit"):
        ToolNames(search=("a", "b"), visit=("b",))
