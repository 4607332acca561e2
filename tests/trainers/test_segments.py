"""Token-level trajectories back into turns (drcredit.trainers.segments), and Search-R1 transcripts.

Tokens here are characters (``decode`` joins them), so spans can be computed by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from drcredit.trainers.converters import ConversionError, ToolNames
from drcredit.trainers.segments import assistant_message, from_search_r1_text, record_from_tokens, token_rollout


def layout(parts: list[tuple[str, bool]]) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """Character tokens of ``(text, is_policy)`` parts; returns ids, mask and the policy parts' spans."""
    ids: list[int] = []
    mask: list[int] = []
    spans = []
    for text, policy in parts:
        if policy:
            spans.append((len(ids), len(ids) + len(text)))
        ids += [ord(c) for c in text]
        mask += [int(policy)] * len(text)
    return ids, mask, spans


def decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


RESULTS = {"results": [{"url": "https://a.org/x", "title": "A", "snippet": "a fact"}]}
PAGES = {"pages": [{"url": "https://a.org/x", "evidence": "the page says so", "summary": "so"}]}


def test_hermes_generations_with_chatml_observations() -> None:
    search = {"name": "search", "arguments": {"queries": ["q1"]}}
    visit = {"name": "visit", "arguments": {"urls": ["https://a.org/x"], "goal": "check"}}
    ids, mask, spans = layout(
        [
            (f"<think>plan</think>Search.<tool_call>{json.dumps(search)}</tool_call><|im_end|>", True),
            (f"\n<|im_start|>user\n<tool_response>{json.dumps(RESULTS)}</tool_response><|im_end|>\n", False),
            (f"<|im_start|>assistant\nRead it.<tool_call>{json.dumps(visit)}</tool_call>", True),
            (f"<|im_start|>tool\n<tool_response>{json.dumps(PAGES)}</tool_response>", False),
            ("<answer>It failed [W1].</answer><|im_end|>", True),
        ]
    )
    record = record_from_tokens(ids, mask, decode, question="q?", rubrics=[{"id": "R1"}])
    assert record["error"] is None, record["error"]
    turns = record["turns"]
    assert [t["type"] for t in turns] == ["search", "visit", "answer"]
    assert record["spans"] == [list(s) for s in spans]
    assert turns[0]["call"]["queries"] == ["q1"] and turns[0]["results"][0]["url"] == "https://a.org/x"
    assert turns[0]["reasoning"] == "plan\n\nSearch."
    assert turns[1]["pages"][0]["evidence"] == "the page says so"
    assert turns[2]["answer"] == "It failed [W1]."
    assert (record["question"], record["rubrics"]) == ("q?", [{"id": "R1"}])


def test_two_calls_in_one_generation_share_its_span() -> None:
    calls = "".join(
        f"<tool_call>{json.dumps({'name': 'search', 'arguments': {'query': q}})}</tool_call>" for q in ("a", "b")
    )
    answers = f"<tool_response>{json.dumps(RESULTS)}</tool_response><tool_response>No results found.</tool_response>"
    ids, mask, spans = layout([(calls, True), (answers, False), ("done", True)])
    record = record_from_tokens(ids, mask, decode)
    assert [t["type"] for t in record["turns"]] == ["search", "search", "answer"]
    assert record["spans"] == [list(spans[0]), list(spans[0]), list(spans[1])]
    assert record["turns"][1]["results"] == []


def test_search_r1_tags_with_custom_tool_names() -> None:
    tools = ToolNames(search=("web_search",), visit=("open_page",))
    ids, mask, spans = layout(
        [
            ("<search>battery fire</search>", True),
            (f"\n<information>{json.dumps(RESULTS)}</information>\n", False),
            ("<access>https://a.org/x</access>", True),
            (f"<information>{json.dumps(PAGES)}</information>", False),
            ("<answer>done</answer>", True),
        ]
    )
    record = record_from_tokens(ids, mask, decode, tools=tools)
    assert record["error"] is None, record["error"]
    assert [t["type"] for t in record["turns"]] == ["search", "visit", "answer"]
    assert record["turns"][0]["call"]["queries"] == ["battery fire"]
    assert record["turns"][1]["call"]["urls"] == ["https://a.org/x"]
    assert record["spans"] == [list(s) for s in spans]


def test_unreadable_trajectories_become_error_records() -> None:
    assert "policy mask of shape" in record_from_tokens([1, 2], [1], decode)["error"]
    ids, mask, _ = layout([("<tool_call>{not json}</tool_call>", True), ("<tool_response>x</tool_response>", False)])
    record = record_from_tokens(ids, mask, decode)
    # an unreadable call is kept as a zero-credit tool turn, never dropped
    assert record["turns"][0]["type"] == "tool" and record["turns"][0]["name"] == "unparsed_tool_call"
    ids, mask, _ = layout([("<search>q</search>", True), ("<information>no urls here</information>", False)])
    assert "search response" in record_from_tokens(ids, mask, decode)["error"]


def test_assistant_message_reads_both_styles() -> None:
    message: dict[str, Any] = assistant_message(
        'x<search>q</search>y<tool_call>{"name": "t", "arguments": {}}</tool_call>'
    )
    names = [c["function"]["name"] for c in message["tool_calls"]]
    assert names == ["t", "search"] and message["content"] == "xy"
    assert "tool_calls" not in assistant_message("plain text")


def test_from_search_r1_text() -> None:
    text = (
        "<think>find it</think><search>calder bay fire</search>"
        f"<information>{json.dumps(RESULTS)}</information>"
        "<visit>https://a.org/x</visit>"
        f"<information>{json.dumps(PAGES)}</information>"
        "<answer>It was a coolant leak.</answer>"
    )
    rollout = from_search_r1_text(text, rollout_id="r0", outcome_reward=1.0)
    assert [t["type"] for t in rollout["turns"]] == ["search", "visit", "answer"]
    assert rollout["turns"][0]["reasoning"] == "find it"
    assert rollout["turns"][1]["pages"][0]["url"] == "https://a.org/x"
    assert rollout["outcome_reward"] == 1.0
    with pytest.raises(ConversionError, match="has no response"):
        from_search_r1_text("<search>q</search><answer>x</answer>", rollout_id="r1")
    with pytest.raises(ConversionError, match="expected a string"):
        from_search_r1_text(None, rollout_id="r2")  # type: ignore[arg-type]


def test_token_rollouts_scored_by_the_real_service(tmp_path: Path) -> None:
    """The recipes' glue: rows from tokens, one step scored, per-token values per row."""
    from drcredit.client import DrCreditClient
    from drcredit.trainers.scoring import score_step
    from drcredit.trainers.settings import DrCreditSettings
    from drcredit.trainers.tokens import turn_advantages
    from drcredit_api.app import create_app
    from tests.support.api import settings_for
    from tests.support.live import serving

    rows, layouts = [], []
    for k in range(3):
        search = {"name": "search", "arguments": {"query": f"q{k}"}}
        ids, mask, spans = layout(
            [
                (f"Look {k}.<tool_call>{json.dumps(search)}</tool_call>", True),
                (f"<tool_response>{json.dumps(RESULTS)}</tool_response>", False),
                (f"<answer>answer {k}</answer>", True),
            ]
        )
        rows.append(
            token_rollout(
                "prompt-7",
                f"r{k}",
                ids,
                mask,
                decode,
                question="What?",
                rubrics=[{"id": "R1", "type": "factual", "description": "It says so.", "weight": 1.0}],
                outcome_reward=float(k),
            )
        )
        layouts.append((mask, spans))
    database = f"sqlite:///{tmp_path / 'tokens.sqlite3'}"
    with serving(create_app(settings_for(database, None))) as url, DrCreditClient(url) as client:
        scored = score_step(rows, DrCreditSettings(base_url=url, timeout_s=60, run="recipes"), step=2)
        document = client.advantages(scored.group_ids[0])
    for k, (mask, spans) in enumerate(layouts):
        values = turn_advantages(document, f"r{k}")
        for value, (start, end) in zip(values, spans, strict=True):
            assert scored.values[k][start:end].tolist() == pytest.approx([value] * (end - start))
        assert not scored.values[k][[m == 0 for m in mask]].any()


def test_a_response_without_policy_tokens_is_a_rollout_with_no_turns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A row whose mask a trainer zeroed (overlong filtering) does not stop the step: it is scored
    as a rollout with no turns (its reward still counts in the outcome normalization), with a
    warning naming it, and none of its tokens gets a value."""
    from drcredit.client import DrCreditClient
    from drcredit.trainers.scoring import score_step
    from drcredit.trainers.settings import DrCreditSettings
    from drcredit_api.app import create_app
    from tests.support.api import settings_for
    from tests.support.live import serving

    record = record_from_tokens([1, 2], [0, 0], decode)
    assert record["error"] is None and record["turns"] == [] and "no policy tokens" in record["warning"]
    search = {"name": "search", "arguments": {"query": "q"}}
    parts = [(f"<tool_call>{json.dumps(search)}</tool_call>", True), (json.dumps(RESULTS), False), ("done", True)]
    ids, mask, _ = layout(parts)
    rubrics = [{"id": "R1", "type": "factual", "description": "It says so.", "weight": 1.0}]
    rows = []
    with caplog.at_level("WARNING", logger="drcredit.trainers"):
        for k, row_mask in enumerate([mask, mask, [0] * len(mask)]):
            rows.append(
                token_rollout(
                    "p", f"r{k}", ids, row_mask, decode, question="What?", rubrics=rubrics, outcome_reward=float(k)
                )
            )
    assert "group p rollout r2: the response has no policy tokens" in caplog.text
    assert rows[2].turns == [] and rows[2].spans == []
    database = f"sqlite:///{tmp_path / 'empty.sqlite3'}"
    with serving(create_app(settings_for(database, None))) as url, DrCreditClient(url) as client:
        scored = score_step(rows, DrCreditSettings(base_url=url, timeout_s=60))
        document = client.advantages(scored.group_ids[0])
    empty = next(r for r in document["rollouts"] if r["id"] == "r2")
    # rewards 0, 1, 2: mean 1, sample standard deviation 1, so r2's outcome advantage is 1
    assert empty["turns"] == [] and empty["outcome_advantage"] == pytest.approx(1.0)
    assert not scored.values[2].any() and len(scored.values[2]) == len(mask)
