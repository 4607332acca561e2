"""Agent logs into rollouts: exact conversions of hand-written logs, errors, a real API round trip.

The logs in ``data/`` are realistic research trajectories (JSON and plain-text tool
outputs, failed visits, two URLs in one visit, parallel calls answered out of order, a
rollout cut by the turn limit, custom tool names). A few evidence texts carry markers
such as ``[R1:2:launch-2021-12-25]`` so that the test judge (``marker_answer``) gives
them credit in the round trip.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from drcredit.domain.group import GroupIn, Rollout
from drcredit.trainers import (
    ConversionError,
    ToolNames,
    broadcast_advantages,
    from_chat_messages,
    from_react_text,
    group_from_rollouts,
    policy_spans,
    turn_advantages,
)
from tests.support.api import api_client
from tests.support.judge_server import JudgeServer

DATA = Path(__file__).parent / "data"
CUSTOM = ToolNames(
    search=("google_search",),
    visit=("read_page",),
    query_keys=("q",),
    url_keys=("link",),
    goal_keys=("purpose", "goal"),
)

NASA = "https://science.nasa.gov/mission/webb/"
WIKI = "https://en.wikipedia.org/wiki/James_Webb_Space_Telescope"
MIRRORS = "https://webb.nasa.gov/content/observatory/ote/mirrors/index.html"
ESA = "https://www.esa.int/Science_Exploration/Space_Science/Webb/Webb_launch"
TIMELINE = "https://webbtelescope.org/news/timeline"
NASA_LAUNCH = "https://www.nasa.gov/webb-launch"
VA256 = "https://www.arianespace.com/mission/ariane-flight-va256/"

QUESTION = "When did the James Webb Space Telescope launch, and how does its primary mirror compare with Hubble's?"
RUBRICS: list[dict[str, Any]] = [
    {"id": "R1", "type": "factual", "description": "States that Webb launched on 25 December 2021.", "weight": 1.0},
    {
        "id": "R2",
        "type": "logical",
        "description": "Compares Webb's 6.5 m primary mirror with Hubble's 2.4 m.",
        "weight": 1.0,
        "trusted_evidence": ["Webb 6.5 m; Hubble 2.4 m"],
    },
]


def chat(name: str) -> list[dict[str, Any]]:
    return json.loads((DATA / name).read_text())  # type: ignore[no-any-return]


def text(name: str) -> str:
    return (DATA / name).read_text()


def result(rid: str, url: str, title: str, snippet: str) -> dict[str, Any]:
    return {"id": rid, "url": url, "title": title, "snippet": snippet}


def page(pid: str, url: str, evidence: str, summary: str | None = None, error: str | None = None) -> dict[str, Any]:
    return {"id": pid, "url": url, "evidence": evidence, "summary": summary, "error": error}


def convert_all() -> dict[str, dict[str, Any]]:
    return {
        "json": from_chat_messages(chat("chat_json_tools.json"), rollout_id="json", outcome_reward=0.9),
        "react": from_react_text(text("react_custom_tools.txt"), rollout_id="react", outcome_reward=0.6, tools=CUSTOM),
        "cut": from_chat_messages(chat("chat_text_truncated.json"), rollout_id="cut", outcome_reward=0.0),
    }


# ----------------------------------------------------------------------------- the fixture logs


def test_chat_with_json_tool_outputs() -> None:
    rollout = from_chat_messages(chat("chat_json_tools.json"), rollout_id="r0", outcome_reward=0.9)
    assert rollout == {
        "id": "r0",
        "outcome_reward": 0.9,
        "turns": [
            {
                "type": "search",
                "reasoning": "Two facts are needed: the launch date and the two mirror diameters.\n\n"
                "I will search for both at once.",
                "call": {"queries": ["James Webb Space Telescope launch date", "JWST primary mirror diameter"]},
                "results": [
                    result(
                        "S1",
                        NASA,
                        "Webb Mission Overview - NASA Science",
                        "Webb launched on Dec. 25, 2021, and is the largest space science telescope ever built.",
                    ),
                    result(
                        "S2",
                        WIKI,
                        "James Webb Space Telescope - Wikipedia",
                        "JWST was launched on 25 December 2021 on an Ariane 5 rocket from Kourou, French Guiana.",
                    ),
                    result(
                        "S3",
                        MIRRORS,
                        "Webb's Mirrors",
                        "Webb's primary mirror is 6.5 meters across, made of 18 hexagonal segments.",
                    ),
                ],
                "error": None,
            },
            {
                "type": "visit",
                "reasoning": "NASA and Wikipedia both give the launch; read them together.",
                "call": {"urls": [NASA, WIKI], "goal": "exact launch date and launch vehicle"},
                "pages": [
                    page(
                        "W1",
                        NASA,
                        "Webb launched on December 25, 2021, aboard an Ariane 5 rocket from Europe's Spaceport "
                        "in Kourou, French Guiana. [R1:2:launch-2021-12-25]",
                        "Launch: 25 December 2021 on Ariane 5 from Kourou.",
                    ),
                    page("W2", WIKI, "", None, "HTTP 403 Forbidden"),
                ],
            },
            {
                "type": "visit",
                "reasoning": "Wikipedia refused the request. Read the mirror page and compute the collecting-area ratio.",
                "call": {"urls": [MIRRORS], "goal": "primary mirror diameter of Webb and of Hubble"},
                "pages": [
                    page(
                        "W3",
                        MIRRORS,
                        "Webb's primary mirror is 6.5 meters (21 feet 4 inches) in diameter, compared with "
                        "2.4 meters for Hubble. [R2:2:mirror-6.5m-vs-2.4m]",
                        "Webb 6.5 m versus Hubble 2.4 m.",
                    )
                ],
            },
            {
                # Second call of the same message, answered first: turns keep call order.
                "type": "tool",
                "reasoning": "Wikipedia refused the request. Read the mirror page and compute the collecting-area ratio.",
                "name": "python",
                "arguments": {"code": "print(round((6.5 / 2.4) ** 2, 1))"},
                "response": "7.3",
            },
            {
                "type": "answer",
                "reasoning": "Both facts are now supported by successful visits.",
                "answer": "# The James Webb Space Telescope\n\n## Launch\n"
                '<cite id="W1">Webb launched on 25 December 2021 on an Ariane 5 from Kourou</cite>.\n\n'
                '## Mirror\n<cite id="W3">Its primary mirror is 6.5 m across, against 2.4 m for Hubble</cite>, '
                "about 7.3 times the collecting area.",
            },
        ],
    }
    Rollout.model_validate(rollout)


def test_chat_with_plain_text_tool_outputs_cut_by_the_turn_limit() -> None:
    rollout = from_chat_messages(chat("chat_text_truncated.json"), rollout_id="r1")
    assert "outcome_reward" not in rollout
    assert rollout["turns"] == [
        {
            "type": "search",
            "reasoning": "Start with the launch.",
            "call": {"queries": ["JWST launch date Ariane 5"]},
            "results": [
                result(
                    "S1",
                    ESA,
                    "Webb launch - ESA",
                    "Date published: 2021-12-25\nSource: ESA\n"
                    "Webb lifted off on an Ariane 5 from Europe's Spaceport in French Guiana.",
                ),
                result(
                    "S2",
                    WIKI,
                    "James Webb Space Telescope - Wikipedia",
                    "The telescope was launched on 25 December 2021.",
                ),
                result(
                    "S3",
                    TIMELINE,
                    "Webb mission timeline",
                    "A month-by-month timeline of Webb's deployment after launch.",
                ),
            ],
            "error": None,
        },
        {
            "type": "visit",
            "reasoning": "Open ESA and Wikipedia.",
            "call": {"urls": [ESA, WIKI], "goal": "launch date and vehicle"},
            "pages": [
                page(
                    "W1",
                    ESA,
                    "On 25 December 2021 at 12:20 GMT, Webb lifted off on Ariane 5 flight VA256 from Kourou. "
                    "[R1:2:launch-2021-12-25]",
                    "Webb launched on 25 December 2021 on Ariane 5 VA256.",
                ),
                page(
                    "W2",
                    WIKI,
                    "",
                    "The webpage content could not be processed, and therefore, no information is available.",
                    "The provided webpage content could not be accessed. Please check the URL or file format.",
                ),
            ],
        },
        {
            "type": "search",
            "reasoning": "Now the payload mass.",
            "call": {"queries": ["JWST VA256 exact payload mass kg"]},
            "results": [],
            "error": None,
        },
        {
            # The assistant message without a tool call before it is kept as reasoning.
            "type": "visit",
            "reasoning": "Nothing found; the timeline page may list it.\n\nVisit the timeline.",
            "call": {"urls": [TIMELINE], "goal": "launch mass"},
            "pages": [page("W3", TIMELINE, "", None, "Request timed out after 30 seconds")],
        },
        {
            # The last call never got a response: the rollout hit its turn limit.
            "type": "visit",
            "reasoning": "Try the site's home page.",
            "call": {"urls": ["https://webbtelescope.org/"], "goal": "launch mass"},
            "pages": [page("W4", "https://webbtelescope.org/", "", None, "no response")],
        },
    ]
    Rollout.model_validate(rollout)


def test_react_text_with_custom_tool_names() -> None:
    rollout = from_react_text(text("react_custom_tools.txt"), rollout_id="r2", outcome_reward=0.6, tools=CUSTOM)
    assert rollout == {
        "id": "r2",
        "outcome_reward": 0.6,
        "turns": [
            {
                "type": "search",
                "reasoning": "The question asks for the launch date and the mirror comparison. Start with a search.",
                "call": {"queries": ["JWST launch Ariane 5 date"]},
                "results": [
                    result(
                        "S1",
                        NASA_LAUNCH,
                        "Webb launch - NASA",
                        "NASA's James Webb Space Telescope launched at 7:20 a.m. EST Saturday, Dec. 25, 2021.",
                    ),
                    result("S2", VA256, "Ariane flight VA256", "Flight VA256 carried the James Webb Space Telescope."),
                ],
                "error": None,
            },
            {
                "type": "visit",
                "reasoning": "Read both results.",
                "call": {"urls": [NASA_LAUNCH, VA256], "goal": "launch date and vehicle"},
                "pages": [
                    page(
                        "W1",
                        NASA_LAUNCH,
                        "NASA's James Webb Space Telescope launched at 7:20 a.m. EST Saturday, Dec. 25, 2021, on an "
                        "Ariane 5 rocket from Europe's Spaceport in French Guiana. [R1:2:launch-2021-12-25]",
                        "Launch on 25 December 2021, Ariane 5, Kourou.",
                    ),
                    page("W2", VA256, "", None, "Failed to fetch page: 503 Service Unavailable"),
                ],
            },
            {
                "type": "tool",
                "reasoning": "Compute the area ratio of the two mirrors.",
                "name": "calculator",
                "arguments": {"expression": "(6.5/2.4)**2"},
                "response": "7.335069444444445",
            },
            {
                "type": "answer",
                "reasoning": "Enough for the launch; the mirror figures are from memory, so keep that part short.",
                "answer": '# JWST\n\n## Launch\n<cite id="W1">Webb launched on 25 December 2021 on an Ariane 5</cite>.',
            },
        ],
    }
    Rollout.model_validate(rollout)


def test_react_text_with_default_names_makes_unknown_tools_tool_turns() -> None:
    rollout = from_react_text(text("react_custom_tools.txt"), rollout_id="r2")
    assert [t["type"] for t in rollout["turns"]] == ["tool", "tool", "tool", "answer"]
    assert rollout["turns"][0]["name"] == "google_search" and rollout["turns"][0]["arguments"] == {
        "q": "JWST launch Ariane 5 date"
    }
    assert rollout["turns"][0]["response"].startswith("[1] Webb launch - NASA\nhttps://www.nasa.gov/webb-launch")


def test_react_text_with_chat_template_markers_cut_by_the_turn_limit() -> None:
    rollout = from_react_text(text("react_qwen_truncated.txt"), rollout_id="r3")
    assert rollout["turns"] == [
        {
            "type": "search",
            "reasoning": "Okay, the user wants the launch date. I should search first.",
            "call": {"queries": ["James Webb launch date"]},
            "results": [result("S1", NASA, "Webb launch", "Webb launched on Dec. 25, 2021.")],
            "error": None,
        },
        {
            "type": "visit",
            "reasoning": "Open it.",
            "call": {"urls": [NASA], "goal": "launch date"},
            "pages": [
                page("W1", NASA, "Webb launched on December 25, 2021, from Kourou.", "Launch date 25 December 2021.")
            ],
        },
        {
            "type": "visit",
            "reasoning": "Check the mirror too.",
            "call": {"urls": [MIRRORS], "goal": "mirror size"},
            "pages": [page("W2", MIRRORS, "", None, "no response")],
        },
    ]
    Rollout.model_validate(rollout)


def test_group_from_converted_rollouts_validates() -> None:
    rollouts = list(convert_all().values())
    doc = group_from_rollouts(
        QUESTION, RUBRICS, rollouts, group_id="run1-step3-q7", params={"cap": 1.0}, metadata={"step": 3}
    )
    assert doc["group_id"] == "run1-step3-q7" and doc["params"] == {"cap": 1.0} and doc["metadata"] == {"step": 3}
    group = GroupIn.model_validate(doc)
    assert [r.id for r in group.rollouts] == ["json", "react", "cut"]
    assert [len(r.turns) for r in group.rollouts] == [5, 4, 5]
    # Pydantic models are accepted as well as dicts.
    again = group_from_rollouts(QUESTION, group.rubrics, group.rollouts)
    assert GroupIn.model_validate(again).rollouts == group.rollouts and "group_id" not in again


def test_group_errors_name_the_field() -> None:
    one = [convert_all()["json"]]
    with pytest.raises(ConversionError, match="a group needs at least 2 rollouts"):
        group_from_rollouts(QUESTION, RUBRICS, one)
    rollouts = list(convert_all().values())
    rollouts[1] = dict(rollouts[1], outcome_reward=None)
    with pytest.raises(ConversionError, match=r"rollouts\[1\]\.outcome_reward"):
        group_from_rollouts(QUESTION, RUBRICS, rollouts)


# ----------------------------------------------------------------------------- the real API


def test_round_trip_through_the_api(tmp_path: Path, marker_judge: JudgeServer) -> None:
    """Converted rollouts scored by the real app, then their advantages spread over tokens.

    Marker judge, default params. json: t0 search whose results NASA, WIKI and MIRRORS are
    all visited later -> navigation 0.5 + 0.5, capped at 1; t1 NASA page [R1:2] -> 0.5 (the
    403 page is unusable); t2 mirrors [R2:2] -> 0.5; t3 python -> 0. react: t0 -> nav 0.5;
    t1 [R1:2] -> 0.5 (own history); t2 calculator -> 0. cut: t0 -> nav 0.5 (ESA visit; the
    timeline visit failed, 0); t1 ESA [R1:2] -> 0.5; t2 empty search, t3 timed out, t4 no
    response -> 0. Every result was visited, so no snippet call is made.
    """
    rollouts = convert_all()
    doc = group_from_rollouts(QUESTION, RUBRICS, list(rollouts.values()), group_id="trainers-rt")
    with api_client(f"sqlite:///{tmp_path / 'db.sqlite3'}", marker_judge.url) as client:
        posted = client.post("/v1/groups", json=doc)
        assert posted.status_code == 202, posted.text
        response = client.get("/v1/groups/trainers-rt/advantages", params={"wait": 30})
        assert response.status_code == 200, response.text
    result_doc = response.json()

    credits = {"json": [1.0, 0.5, 0.5, 0.0], "react": [0.5, 0.5, 0.0], "cut": [0.5, 0.5, 0.0, 0.0, 0.0]}
    pooled = [c for cs in credits.values() for c in cs]
    mu = sum(pooled) / len(pooled)
    sigma = math.sqrt(sum((c - mu) ** 2 for c in pooled) / len(pooled))
    rewards = {"json": 0.9, "react": 0.6, "cut": 0.0}
    mu_o = sum(rewards.values()) / 3
    sigma_o = math.sqrt(sum((r - mu_o) ** 2 for r in rewards.values()) / 2)
    for rid, rollout in rollouts.items():
        got = next(r for r in result_doc["rollouts"] if r["id"] == rid)
        assert [t["type"] for t in got["turns"]] == [t["type"] for t in rollout["turns"]]
        assert [t["credit"] for t in got["turns"][: len(credits[rid])]] == [pytest.approx(c) for c in credits[rid]]
        a_o = (rewards[rid] - mu_o) / sigma_o
        expected = [a_o + (c - mu) / sigma for c in credits[rid]]
        if rollout["turns"][-1]["type"] == "answer":
            expected.append(a_o)
        assert turn_advantages(result_doc, rid) == [pytest.approx(x) for x in expected]
    assert marker_judge.count("visit") == 8 and marker_judge.count("snippet") == 0

    # The react rollout's response tokens: each turn's generated tokens, then its tool output.
    mask = np.ones(30, dtype=np.int64)
    mask[4:9] = mask[13:20] = mask[23:25] = 0
    spans = policy_spans(mask)
    assert spans == [(0, 4), (9, 13), (20, 23), (25, 30)]
    advantages = turn_advantages(result_doc, "react")
    tokens = broadcast_advantages(advantages, spans, mask, length=30)
    expected_tokens = np.zeros(30, dtype=np.float32)
    for (start, end), value in zip(spans, advantages, strict=True):
        expected_tokens[start:end] = value
    np.testing.assert_array_equal(tokens, expected_tokens)
    assert tokens[26] == np.float32(result_doc["rollouts"][1]["outcome_advantage"])


# ----------------------------------------------------------------------------- formats


def search_call(response: Any, *, queries: Any = ("q",)) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "question"},
        {
            "role": "assistant",
            "content": "look",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "web_search", "arguments": json.dumps({"queries": list(queries)})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": response},
    ]


def visit_call(response: Any, urls: list[str]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "question"},
        {
            "role": "assistant",
            "content": "read",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "web_visit", "arguments": json.dumps({"urls": urls, "goal": "facts"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": response},
    ]


def only_turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
    rollout = from_chat_messages(messages, rollout_id="x")
    Rollout.model_validate(rollout)
    [turn] = rollout["turns"]
    assert isinstance(turn, dict)
    return turn


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


# ----------------------------------------------------------------------------- errors


def chat_error(messages: list[Any]) -> str:
    with pytest.raises(ConversionError) as info:
        from_chat_messages(messages, rollout_id="x")
    return str(info.value)


def test_invalid_json_arguments_name_the_message() -> None:
    messages = chat("chat_json_tools.json")
    messages[4]["tool_calls"][0]["function"]["arguments"] = '{"urls": ["https://a.org"'
    message = chat_error(messages)
    assert message.startswith("messages[4].tool_calls[0].function.arguments: ")
    assert "arguments of 'web_visit' are not valid JSON" in message


def test_tool_response_with_no_matching_call() -> None:
    messages = chat("chat_json_tools.json")
    messages[3]["tool_call_id"] = "call_zz"
    assert chat_error(messages).startswith("messages[3]: tool response for 'call_zz'")
    messages = chat("chat_json_tools.json")
    messages.insert(2, {"role": "tool", "content": "stray"})
    assert chat_error(messages) == "messages[2]: tool response with no matching tool call"
    messages = chat("chat_json_tools.json")
    messages.insert(4, dict(messages[3]))
    assert chat_error(messages).startswith("messages[4]: a second response to tool call 'call_a1'")


def test_tool_call_without_response_before_the_next_step() -> None:
    messages = chat("chat_json_tools.json")
    del messages[7]  # the python call's response
    message = chat_error(messages)
    assert (
        message
        == "messages[6].tool_calls[1]: tool call 'python' has no response before the next assistant message (messages[8])"
    )


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda m: m.insert(3, {"role": "function", "content": "x"}), "messages[3]: unknown message role 'function'"),
        (lambda m: m.__setitem__(1, "hello"), "messages[1]: expected a message object, got str"),
        (
            lambda m: m[2].update(tool_calls=None, function_call={"name": "web_search", "arguments": "{}"}),
            "messages[2]: legacy 'function_call' is not supported",
        ),
        (
            lambda m: m.__setitem__(9, {"role": "assistant", "content": '<tool_call>{"name": "x"}</tool_call>'}),
            "messages[9]: a <tool_call> block in the text of a chat message",
        ),
        (lambda m: m[2]["tool_calls"][0]["function"].pop("name"), "messages[2].tool_calls[0].function.name: missing"),
        (
            lambda m: m[2]["tool_calls"][0]["function"].update(arguments='["a"]'),
            "messages[2].tool_calls[0].function.arguments: arguments of 'web_search' must be a JSON object",
        ),
        (lambda m: m[2]["tool_calls"][0].update(type="retrieval"), "messages[2].tool_calls[0].type: unsupported"),
        (
            lambda m: m[6]["tool_calls"][1].update(id="call_a3"),
            "messages[6].tool_calls[1]: duplicate tool call id 'call_a3'",
        ),
        (
            lambda m: m[3].update(content=json.dumps([{"title": "no url"}])),
            "messages[3]: search result 0 has no url",
        ),
        (
            lambda m: m[3].update(content="Here is what I found about the telescope."),
            "messages[3]: search response is neither JSON nor numbered text entries",
        ),
        (
            lambda m: m[3].update(content="1. A title\nsome snippet"),
            "messages[3]: search entry 1 ('A title') has no URL",
        ),
        (
            lambda m: m[5].update(content="Both pages say it launched in 2021."),
            "messages[5]: visit response for 2 URLs has no per-URL sections",
        ),
        (
            lambda m: m[5].update(content=json.dumps([{"evidence": "only one page, no url"}])),
            "messages[5]: page 0 has no url and the call has 2 URLs for 1 pages",
        ),
        (lambda m: m[3].update(content=[{"type": "image_url"}]), "messages[3].content[0]: only text content parts"),
        (
            lambda m: m[4]["tool_calls"][0]["function"].update(arguments='{"urls": [{"u": 1}]}'),
            "messages[4].tool_calls[0]: argument 'urls' must hold strings",
        ),
    ],
)
def test_chat_errors_name_the_message(change: Any, expected: str) -> None:
    messages = chat("chat_json_tools.json")
    change(messages)
    assert chat_error(messages).startswith(expected)


def test_inputs_with_nothing_to_convert() -> None:
    assert (
        chat_error([{"role": "user", "content": "q"}]) == "messages: no assistant message: there is nothing to convert"
    )
    assert chat_error("not a list") == "messages: expected a list of messages, got str"  # type: ignore[arg-type]


def test_an_invalid_rollout_is_refused_before_it_leaves() -> None:
    with pytest.raises(ConversionError) as info:
        from_chat_messages(chat("chat_json_tools.json"), rollout_id="r", outcome_reward=math.nan)
    assert str(info.value).startswith("rollout 'r': outcome_reward")
    with pytest.raises(ConversionError, match="rollout '': id"):
        from_react_text("final words", rollout_id="")


def react_error(transcript: str) -> str:
    with pytest.raises(ConversionError) as info:
        from_react_text(transcript, rollout_id="x")
    return str(info.value)


CALL = '<tool_call>{"name": "web_search", "arguments": {"queries": ["q"]}}</tool_call>'
RESPONSE = "<tool_response>No results found.</tool_response>"
AFTER_ONE = len(CALL + RESPONSE)


@pytest.mark.parametrize(
    ("transcript", "expected"),
    [
        (
            'think\n<tool_call>{"name": "web_search", "arguments": {"queries": [</tool_call>',
            "block 1 (<tool_call> at offset 6): tool call is not valid JSON",
        ),
        (
            CALL + RESPONSE + RESPONSE,
            f"block 3 (<tool_response> at offset {AFTER_ONE}): tool response with no matching tool call",
        ),
        ("<tool_response>x</tool_response>", "block 1 (<tool_response> at offset 0): tool response with no matching"),
        (
            CALL + "<tool_response>never closed",
            f"block 2 (<tool_response> at offset {len(CALL)}): <tool_response> is never closed",
        ),
        (CALL + RESPONSE + "</tool_response>", f"offset {AFTER_ONE}: </tool_response> without its opening tag"),
        (
            CALL + RESPONSE + "<answer>done</answer>" + CALL,
            f"block 4 (<tool_call> at offset {AFTER_ONE + 21}): <tool_call> after the final <answer>",
        ),
        (
            CALL + CALL + RESPONSE + CALL,
            f"block 2 (<tool_call> at offset {len(CALL)}): tool call 'web_search' has no response before the next "
            f"tool call (block 4 (<tool_call> at offset {AFTER_ONE + len(CALL)}))",
        ),
        (
            CALL + "<answer>x</answer>",
            "block 1 (<tool_call> at offset 0): tool call 'web_search' has no response before the final answer",
        ),
        (CALL + "\nand then more text", f"offset {len(CALL)}: text after a tool call that has no response"),
        ('<tool_call>{"arguments": {}}</tool_call>', "block 1 (<tool_call> at offset 0): tool call has no 'name'"),
        ('<tool_call>["web_search"]</tool_call>', "block 1 (<tool_call> at offset 0): tool call must be a JSON object"),
    ],
)
def test_react_errors_name_the_block(transcript: str, expected: str) -> None:
    assert react_error(transcript).startswith(expected)


def test_react_parallel_calls_and_final_text_without_answer_tags() -> None:
    transcript = (
        CALL
        + '\n<tool_call>{"name": "web_visit", "parameters": {"urls": ["https://a.org"]}}</tool_call>\n'
        + RESPONSE
        + "<tool_response>Evidence: ev</tool_response>\n<think>ok</think>\nThe report."
    )
    rollout = from_react_text(transcript, rollout_id="x")
    assert [t["type"] for t in rollout["turns"]] == ["search", "visit", "answer"]
    assert rollout["turns"][1]["pages"] == [page("W1", "https://a.org", "ev")]
    assert rollout["turns"][2] == {"type": "answer", "reasoning": "ok", "answer": "The report."}
    ended = from_react_text(CALL + RESPONSE + "\n", rollout_id="x")
    assert [t["type"] for t in ended["turns"]] == ["search"]


def test_reports_keep_their_citation_markup() -> None:
    """The outcome reward (docs/method.md, "Outcome reward") reads <cite id="...">...</cite> in
    the report: converters keep it as written."""
    report = '# Findings\n## Detail\nIt opened <cite id="W1, W2">in 2019</cite>.'
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": f"<answer>{report}</answer>"}]
    assert only_turn(chat)["answer"] == report
    react = from_react_text(f"<answer>{report}</answer>", rollout_id="r0")
    assert react["turns"][-1]["answer"] == report
