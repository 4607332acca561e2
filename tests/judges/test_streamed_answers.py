"""Streamed answers over real HTTP: read as one answer, their first event timed as the end
of the prompt's prefill (what the fleet's prefill queue learns from), and every way a
stream can go wrong read as the kind of failure it is, never as a judgment."""

from __future__ import annotations

import json
from typing import Any

import pytest

from drcredit.judges.fleet.endpoints import parse_endpoints
from drcredit.judges.fleet.router import Lease
from tests.judges.test_openai_judge import GOOD, judge_for, sequence, visit_request
from tests.support.judge_server import Reply


def test_a_streamed_answer_reads_as_the_answer_with_its_usage_and_cached_tokens() -> None:
    usage = {"prompt_tokens": 900, "completion_tokens": 30, "prompt_tokens_details": {"cached_tokens": 640}}
    with judge_for(lambda c: Reply.json(GOOD, usage=usage), streams=True) as (judge, server):
        result = judge.judge_visit(visit_request())
    assert result.status == "ok" and result.verdict is not None
    assert (result.verdict.level, result.verdict.page_ids) == (2, ("W1",))
    assert (result.prompt_tokens, result.completion_tokens) == (900, 30)
    assert result.attempts[0].cached_tokens == 640
    sent = server.calls[0].request
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_the_first_event_is_timed_when_the_prompt_is_prefilled_not_when_the_answer_ends() -> None:
    seen: list[float] = []
    with judge_for(lambda c: Reply.json(GOOD, prefill=0.3, delay=0.6), streams=True) as (judge, _):
        told = judge.fleet.first_event

        def spy(lease: Lease, seconds: float) -> None:
            seen.append(seconds)
            told(lease, seconds)

        judge.fleet.first_event = spy  # type: ignore[method-assign]
        result = judge.judge_visit(visit_request())
        queue = judge.fleet.endpoints[0].prefill
        assert result.status == "ok" and result.attempts[0].latency_s >= 0.9
        assert len(seen) == 1 and 0.3 <= seen[0] < 0.6
        # The endpoint streams: its calls waiting for their prefill are bounded, and none waits now.
        assert queue.gates and queue.waiting == 0


def test_a_server_that_answers_a_stream_request_in_one_body_is_read_as_before_and_never_gated() -> None:
    with judge_for(lambda c: Reply.json(GOOD), streams=False) as (judge, server):
        results = [judge.judge_visit(visit_request()) for _ in range(3)]
        queue = judge.fleet.endpoints[0].prefill
        assert all(r.status == "ok" for r in results)
        assert server.calls[0].request["stream"] is True
        assert not queue.gates and queue.waiting == 0


def test_a_stream_whose_first_event_comes_with_its_last_is_buffered_and_not_gated() -> None:
    # A proxy that buffers the stream: the first event arrives at the end of the answer.
    with judge_for(lambda c: Reply.json(GOOD, prefill=0.3), streams=True) as (judge, _):
        for _ in range(4):
            assert judge.judge_visit(visit_request()).status == "ok"
        assert not judge.fleet.endpoints[0].prefill.gates


@pytest.mark.parametrize(
    ("reply", "outcome"),
    [
        (Reply.json(GOOD, stream_error="the server is overloaded"), "server_error"),
        (Reply.json(GOOD, stream_cut=True), "connection"),
        (Reply.json(GOOD, prefill=0.1, delay=1.5), "timeout"),
    ],
    ids=["error-event", "cut-off", "too-slow"],
)
def test_a_stream_that_goes_wrong_after_its_first_event_is_a_failed_attempt_then_retried(
    reply: Reply, outcome: str
) -> None:
    with judge_for(sequence(reply, Reply.json(GOOD)), streams=True, timeout=0.8) as (judge, server):
        result = judge.judge_visit(visit_request())
        queue = judge.fleet.endpoints[0].prefill
        assert result.status == "ok"
        assert [a.outcome for a in result.attempts] == [outcome, "ok"]
        assert server.count() == 2
        # The failed call's place in the prefill queue was given back.
        assert queue.waiting == 0


def test_an_endpoint_set_not_to_stream_is_sent_plain_requests() -> None:
    def no_stream(url: str) -> str:
        return json.dumps([{"url": url, "stream": False}])

    with judge_for(lambda c: Reply.json(GOOD), streams=True, base_url=no_stream) as (judge, server):
        assert judge.judge_visit(visit_request()).status == "ok"
    assert "stream" not in server.calls[0].request


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_an_endpoints_stream_must_be_true_or_false(value: Any) -> None:
    setting = json.dumps([{"url": "http://judge:8000/v1", "stream": value}])
    with pytest.raises(ValueError, match=r"DRCREDIT_JUDGE_BASE_URL\[0\]\.stream: expected true or false"):
        parse_endpoints(setting)
