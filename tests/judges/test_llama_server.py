"""The ``openai`` judge against a real llama.cpp ``llama-server`` (SmolLM2-135M on the CPU).

Nobody here wrote that server: these tests check what the platform does with its real
answers, limits and errors (structured output, plain JSON, the context window, cut-off
answers, token usage and its prefix cache). A recording proxy between the two shows what
was sent. The 135M model's judgments are poor; only the platform's behaviour is tested.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import orjson
import pytest

from drcredit.judges.attempts import RETRY_TEMPERATURE
from drcredit.judges.base import Prompt, RetryPolicy, parse_json_answer
from drcredit.judges.openai_judge import OpenAIJudge, ResponseFormat
from tests.judges.test_openai_judge import snippet_request, visit_request
from tests.support.llama_server import MODEL, LlamaServer, running_llama
from tests.support.recording_proxy import RecordingProxy, recording_proxy

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """2,048 tokens per request over two slots, as a small judge deployment would give."""
    with running_llama(tmp_path_factory.mktemp("llama"), ctx=4096, parallel=2) as server:
        yield server


@pytest.fixture
def tight(tmp_path: Path) -> Iterator[LlamaServer]:
    """1,024 tokens in one slot: less than a visit prompt needs."""
    with running_llama(tmp_path, ctx=1024, parallel=1) as server:
        yield server


@pytest.fixture
def proxy(llama: LlamaServer) -> Iterator[RecordingProxy]:
    with recording_proxy(llama.root) as p:
        yield p


def judge_at(
    url: str, *, response_format: ResponseFormat = "auto", max_tokens: int = 256, attempts: int = 3
) -> OpenAIJudge:
    return OpenAIJudge(
        base_url=url,
        model=MODEL,
        timeout_s=60,
        max_tokens=max_tokens,
        response_format=response_format,
        retry=RetryPolicy(max_attempts=attempts, backoff_initial_s=0.01, backoff_max_s=0.05),
    )


def assert_room_respected(proxy: RecordingProxy, context: int) -> None:
    """No request asked for more answer tokens than its prompt left of the context."""
    answered = [x for x in proxy.chats() if x.status == 200]
    assert answered
    for x in answered:
        assert x.request["max_tokens"] + x.response["usage"]["prompt_tokens"] <= context, x.request["max_tokens"]


def content(exchange: Any) -> str:
    return str(exchange.response["choices"][0]["message"]["content"])


def test_structured_output_answers_have_the_schemas_shape(proxy: RecordingProxy, llama: LlamaServer) -> None:
    judge = judge_at(proxy.url)
    visit = judge.judge_visit(visit_request())
    snippets = judge.judge_snippets(snippet_request())
    shaped = 0
    for x in proxy.chats():
        form = x.request["response_format"]
        assert form["type"] == "json_schema" and form["json_schema"]["strict"] is True
        if x.response["choices"][0]["finish_reason"] == "stop":
            jsonschema.validate(orjson.loads(content(x)), form["json_schema"]["schema"])
            shaped += 1
    assert shaped >= 1
    for result in (visit, snippets):
        assert result.status == "ok" or (result.failure_reason or "").startswith("invalid after")
    assert_room_respected(proxy, llama.slot_context)


def test_plain_json_mode_sends_no_response_format_and_reads_the_text_honestly(proxy: RecordingProxy) -> None:
    judge = judge_at(proxy.url, response_format="none", max_tokens=96, attempts=2)
    result = judge.judge_snippets(snippet_request())
    chats = proxy.chats()
    assert chats and all("response_format" not in x.request for x in chats)
    assert len(result.attempts) == len(chats)
    if result.status == "ok":
        assert result.answer == parse_json_answer(content(chats[-1]))
    else:
        assert (result.failure_reason or "").startswith(f"invalid after {len(chats)} attempts")
    for attempt, x in zip(result.attempts, chats, strict=True):
        assert attempt.outcome in ("ok", "invalid")
        assert attempt.prompt_tokens == x.response["usage"]["prompt_tokens"]


def test_a_prompt_over_the_context_fails_at_once_naming_the_tokens(tight: LlamaServer) -> None:
    """Its estimated size leaves no room: the server counts it (template and tokenizer),
    and the judgment fails before any chat request, with that count and the context."""
    with recording_proxy(tight.root) as proxy:
        judge = judge_at(proxy.url)
        result = judge.judge_visit(visit_request())
        assert proxy.chats() == [] and any(x.path.endswith("/tokenize") for x in proxy.exchanges)
        assert result.status == "failed" and [a.outcome for a in result.attempts] == ["context_length"]
        reason = result.failure_reason or ""
        assert reason.startswith("context_length: ") and "about" not in reason
        assert not judge.breaker.is_open and judge.fleet.endpoints[0].health.up
        assert judge.response_format_of(proxy.url) == "auto"

        # The count is the server's own: the same request sent as is gets a 400 saying so.
        prompt = judge.visit_prompt(visit_request())
        refused = httpx.post(
            f"{tight.root}/v1/chat/completions",
            json={"model": MODEL, "messages": prompt.messages, "max_tokens": 16},
            timeout=60,
        )
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["type"] == "exceed_context_size_error"
        assert f"needs {error['n_prompt_tokens']} tokens" in reason and f"holds {error['n_ctx']}" in reason

        # Later calls are made as before: structured output, room bounded by the context.
        judge.judge_snippets(snippet_request())
        later = proxy.chats()
        assert later and all(x.request["response_format"]["type"] == "json_schema" for x in later)
        assert_room_respected(proxy, tight.slot_context)


def test_a_server_that_cannot_count_refuses_an_overflow_with_its_own_numbers(tight: LlamaServer) -> None:
    """Without the server's count (its tokenizer endpoints unreachable through this
    proxy), the request goes; the server's 400 names the tokens; the same prompt again is
    refused before it is sent, on the count the server gave."""
    with recording_proxy(tight.root, refuse=("/tokenize", "/apply-template")) as proxy:
        judge = judge_at(proxy.url)
        result = judge.judge_visit(visit_request())
        [sent] = proxy.chats()
        error = sent.response["error"]
        assert sent.status == 400 and error["type"] == "exceed_context_size_error"
        assert result.status == "failed" and [a.outcome for a in result.attempts] == ["context_length"]
        assert f"needs {error['n_prompt_tokens']} tokens" in (result.failure_reason or "")
        again = judge.judge_visit(visit_request())
        assert len(proxy.chats()) == 1 and again.attempts[0].outcome == "context_length"
        assert "needs about" in (again.failure_reason or "")


def test_an_answer_cut_off_at_max_tokens_is_asked_again_differently(proxy: RecordingProxy) -> None:
    judge = judge_at(proxy.url, max_tokens=8, attempts=2)
    result = judge.judge_snippets(snippet_request())
    first, second = proxy.chats()
    assert first.response["choices"][0]["finish_reason"] == "length"
    assert result.attempts[0].finish_reason == "length"
    assert result.attempts[0].error == "cut off at the max_tokens limit (8 tokens)"
    assert first.request["temperature"] == 0.0 and first.request["max_tokens"] == 8
    # The retry: twice the room, a little temperature, and the cut-off answer shown back.
    assert second.request["max_tokens"] == 16 and second.request["temperature"] == RETRY_TEMPERATURE
    assert second.request["messages"][: len(first.request["messages"])] == first.request["messages"]
    shown, note = second.request["messages"][-2:]
    assert shown == {"role": "assistant", "content": content(first)}
    assert note["role"] == "user" and "cut off at the max_tokens limit (8 tokens)" in note["content"]


def test_the_room_for_the_answer_is_what_the_server_counts_the_prompt_leaves(tight: LlamaServer) -> None:
    with recording_proxy(tight.root) as proxy:
        judge = judge_at(proxy.url, max_tokens=1024, attempts=1)
        judge.judge_snippets(snippet_request())
        [chat] = proxy.chats()
    prompt_tokens = chat.response["usage"]["prompt_tokens"]
    assert chat.request["max_tokens"] == 1024 - prompt_tokens


def test_an_answer_bounded_by_the_context_says_so_and_the_retry_gets_the_room_now_known(tight: LlamaServer) -> None:
    """Where the server cannot count (its tokenizer endpoints refused here), the first
    request's room comes from a conservative estimate of the prompt's size."""
    with recording_proxy(tight.root, refuse=("/tokenize", "/apply-template")) as proxy:
        judge = judge_at(proxy.url, max_tokens=1024, attempts=2)
        result = judge.judge_snippets(snippet_request())
        first, second = proxy.chats()[:2]
        prompt_tokens = first.response["usage"]["prompt_tokens"]
        # Before any answer the prompt's size is a conservative guess: the answer's room
        # was cut below the setting to fit the context, and the cut-off says so.
        assert first.request["max_tokens"] < 1024 - prompt_tokens
        assert first.response["choices"][0]["finish_reason"] == "length"
        assert result.attempts[0].error == (
            f"cut off at {first.request['max_tokens']} answer tokens, the room kept for the answer within the"
            f" context window (1024 tokens) after the {prompt_tokens}-token prompt"
        )
        # Now the server has counted the prompt: the retry gets far more room, and still
        # no more than the context leaves.
        assert second.request["max_tokens"] > 2 * first.request["max_tokens"]
        assert_room_respected(proxy, tight.slot_context)


def test_usage_and_prefix_cache_hits_are_recorded_on_attempts(tight: LlamaServer) -> None:
    with recording_proxy(tight.root) as proxy:
        judge = judge_at(proxy.url, max_tokens=96, attempts=1)
        first = judge.judge_snippets(snippet_request())
        second = judge.judge_snippets(snippet_request())
        a, b = proxy.chats()
    for attempt, x in ((first.attempts[0], a), (second.attempts[0], b)):
        usage = x.response["usage"]
        assert attempt.prompt_tokens == usage["prompt_tokens"] > 0
        assert attempt.completion_tokens == usage["completion_tokens"] > 0
        assert attempt.cached_tokens == usage["prompt_tokens_details"]["cached_tokens"]
        assert attempt.endpoint == proxy.url and attempt.model == MODEL
    # A fresh server has nothing cached; the same prompt again reuses all but its last token.
    assert first.attempts[0].cached_tokens == 0
    assert second.attempts[0].cached_tokens == second.attempts[0].prompt_tokens - 1


def test_a_server_that_cannot_take_a_schema_falls_back_to_plain_json_for_that_endpoint(
    proxy: RecordingProxy,
) -> None:
    """llama.cpp answers 400 "JSON schema conversion failed" for a schema its grammar
    cannot express: in ``auto`` mode the endpoint is asked for plain JSON instead."""
    judge = judge_at(proxy.url, attempts=1)
    prompt = Prompt(
        kind="snippet",
        system="You answer in JSON.",
        user='Answer with the JSON object {"ok": true} and nothing else.',
        schema_name="odd",
        schema={"type": "no-such-type"},
    )
    result = judge._run_to_completion(judge._arun(prompt, lambda answer: answer))
    refused, plain = proxy.chats()
    assert refused.status == 400 and "schema" in refused.response["error"]["message"].lower()
    assert "response_format" not in plain.request and plain.status == 200
    assert judge.response_format_of(proxy.url) == "none"
    assert result.attempts[0].outcome == "invalid" and result.attempts[0].spent is False
