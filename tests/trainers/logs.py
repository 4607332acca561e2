"""The converters' tests' material: the hand-written logs in ``data/`` and how to read
them, the question and rubrics they answer, and one-call chat logs to convert."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from drcredit.domain.group import Rollout
from drcredit.trainers import (
    ToolNames,
    from_chat_messages,
    from_react_text,
)

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


def one_call(said: str, tool: str, arguments: dict[str, Any], response: Any) -> list[dict[str, Any]]:
    """A question, one assistant step calling ``tool`` with ``arguments``, and its answer."""
    call = {"id": "c1", "type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}
    return [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": said, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": response},
    ]


def search_call(response: Any, *, queries: Any = ("q",)) -> list[dict[str, Any]]:
    return one_call("look", "web_search", {"queries": list(queries)}, response)


def visit_call(response: Any, urls: list[str]) -> list[dict[str, Any]]:
    return one_call("read", "web_visit", {"urls": urls, "goal": "facts"}, response)


def only_turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
    rollout = from_chat_messages(messages, rollout_id="x")
    Rollout.model_validate(rollout)
    [turn] = rollout["turns"]
    assert isinstance(turn, dict)
    return turn
