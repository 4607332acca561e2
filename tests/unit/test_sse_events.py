"""Reading a streamed chat completion (``judges.openai_wire``): server-sent events as servers
send them, in chunks cut anywhere, added up to the one body a plain answer has."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx2
import orjson
import pytest

from drcredit.judges.openai_wire import NoAnswer, assembled, sse_data
from drcredit.judges.results import RetryableError
from tests.support import aio


def response(*chunks: bytes) -> httpx2.Response:
    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    return httpx2.Response(200, content=body())


def read(*chunks: bytes) -> tuple[list[Any], int]:
    firsts: list[int] = []

    async def run() -> list[Any]:
        return [event async for event in sse_data(response(*chunks), lambda: firsts.append(1))]

    return aio.run(run()), len(firsts)


def test_events_cut_across_chunks_with_crlf_and_comments_read_whole() -> None:
    events, firsts = read(
        b': keep-alive\r\n\r\ndata: {"a"', b": 1}\r", b'\n\r\ndata: {"b": 2}\n\ndata: [DONE]\n\ndata: {"c": 3}\n\n'
    )
    assert events == [{"a": 1}, {"b": 2}]  # nothing after [DONE]
    assert firsts == 1  # told once, at the first bytes


def test_an_event_that_is_not_json_is_an_invalid_answer() -> None:
    with pytest.raises(RetryableError, match="unreadable streamed event") as caught:
        read(b"data: <html>502</html>\n\n")
    assert caught.value.outcome == "invalid"


def test_the_events_add_up_to_the_body_of_a_plain_answer() -> None:
    chunks = [
        b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "model": "m"}\n\n',
        b'data: {"choices": [{"index": 0, "delta": {"content": "{\\"level\\": "}}]}\n\n',
        b'data: {"choices": [{"index": 0, "delta": {"content": "2}"}}]}\n\n',
        b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n',
        b'data: {"choices": [], "usage": {"prompt_tokens": 90, "completion_tokens": 4}, "timings": {"cache_n": 64}}\n\n',
        b"data: [DONE]\n\n",
    ]
    body = orjson.loads(aio.run(assembled(response(*chunks), lambda: None)))
    assert body == {
        "model": "m",
        "usage": {"prompt_tokens": 90, "completion_tokens": 4},
        "timings": {"cache_n": 64},
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": '{"level": 2}'}}],
    }


def test_an_error_event_is_a_server_error() -> None:
    chunks = [
        b'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n',
        b'data: {"error": {"message": "overloaded"}}\n\n',
    ]
    with pytest.raises(NoAnswer, match="overloaded") as caught:
        aio.run(assembled(response(*chunks), lambda: None))
    assert caught.value.outcome == "server_error"
