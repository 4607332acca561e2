"""Agent logs into rollouts: exact conversions of hand-written logs, errors, a real API round trip.

The logs in ``data/`` are realistic research trajectories (JSON and plain-text tool
outputs, failed visits, two URLs in one visit, parallel calls answered out of order, a
rollout cut by the turn limit, custom tool names). A few evidence texts carry markers
such as ``[R1:2:launch-2021-12-25]`` so that the test judge (``marker_answer``) gives
them credit in the round trip.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from drcredit.domain.group import GroupIn, Rollout
from drcredit.trainers import (
    ConversionError,
    broadcast_advantages,
    from_chat_messages,
    from_react_text,
    group_from_rollouts,
    policy_spans,
    turn_advantages,
)
from tests.support.api import api_client
from tests.support.judge_server import JudgeServer
from tests.trainers.logs import (
    CUSTOM,
    ESA,
    MIRRORS,
    NASA,
    NASA_LAUNCH,
    QUESTION,
    RUBRICS,
    TIMELINE,
    VA256,
    WIKI,
    chat,
    convert_all,
    page,
    result,
    text,
)

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
