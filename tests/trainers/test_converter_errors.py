"""What the converters refuse, and how each error names the message or block at fault."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from drcredit.trainers import (
    ConversionError,
    from_chat_messages,
    from_react_text,
)
from tests.trainers.logs import (
    chat,
    only_turn,
    page,
)

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
