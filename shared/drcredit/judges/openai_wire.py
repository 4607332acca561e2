"""The wire of an OpenAI-compatible chat-completions server: what one request carries,
how it is sent, and how the answer and the errors read.

The request goes through the official ``openai`` client's generic ``post`` with the
chat-completions body as the wire format: its typed ``chat.completions.create`` costs
several times the CPU of the rest of a judgment (BENCHMARKS.md) for a body that needs no
transformation, and the client is built with ``max_retries=0`` (the judge's own loop
retries). The body comes back as bytes and is parsed here with orjson, so a malformed
answer is an invalid attempt, never an exception of the client's model layer. Each error
the client raises maps to one kind: no answer (:class:`NoAnswer`: connection, timeout,
5xx), a rate limit (:class:`RateLimited`), a refused request (:class:`BadRequest`) or a
fatal one.

Answers are asked as streams where the endpoint allows (``stream`` in its settings): the
events add up here to the same body, and their first bytes tell the fleet the prompt is
prefilled (:mod:`~drcredit.judges.fleet.prefill`). A server that answers in one body is
read as one; an error event is a server error and a stream broken off a connection
error.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx2
import openai
import orjson
from openai import AsyncOpenAI

from drcredit.judges.attempts import AttemptPlan
from drcredit.judges.base import Completion, FatalJudgeError, Prompt, RetryableError
from drcredit.judges.fleet.endpoints import EndpointConfig
from drcredit.judges.fleet.rates import RateHeaders, read_headers

ResponseFormat = Literal["auto", "json_schema", "json_object", "none"]

#: Status codes the official client would retry: the server may answer differently next time.
_RETRYABLE_STATUS = frozenset({408, 409, 425})

#: Each request's idempotency key, which the client otherwise makes with uuid4 (a
#: system call per judgment, 2.5% of a visit worker's CPU in the benchmark): unique per
#: process and request, which is all the client needs of it.
_REQUEST_NUMBERS = itertools.count()
_PROCESS = f"drcredit-{os.getpid()}-{os.urandom(4).hex()}"

#: The client's own per-request defaults, given explicitly: an option left out is filled
#: with a deep copy of its default on every request (pydantic's ``model_construct``), the
#: security dict 15-20 us and each ``NotGiven`` default a ``copy`` reconstruction (the
#: three took the options build from 20 to 12 us). ``max_retries`` is 0, as the client
#: is built; headers, timeout and parser stay the client's (not given).
_SECURITY: Any = {"bearer_auth": True, "admin_api_key_auth": True}
_NOT_GIVEN = openai.NOT_GIVEN


def request_options() -> Any:
    # The body goes as bytes encoded with orjson (the client's own encoder is the
    # stdlib's), under the client's default Content-Type: application/json.
    return {
        "idempotency_key": f"{_PROCESS}-{next(_REQUEST_NUMBERS)}",
        "security": _SECURITY,
        "max_retries": 0,
        "headers": _NOT_GIVEN,
        "timeout": _NOT_GIVEN,
        "post_parser": _NOT_GIVEN,
    }


#: The client's telemetry headers, left out (an ``Omit`` value removes a default
#: header): each header is normalized and merged again for every request, and these
#: seven were a fifth of the client's CPU per judgment. Nothing a judge server reads.
QUIET_HEADERS: Any = {
    name: openai.Omit()
    for name in (
        "X-Stainless-Lang",
        "X-Stainless-Package-Version",
        "X-Stainless-OS",
        "X-Stainless-Arch",
        "X-Stainless-Runtime",
        "X-Stainless-Runtime-Version",
        "X-Stainless-Async",
    )
}

#: Idle seconds before a pooled connection is dropped: under the 5 s keep-alive of
#: uvicorn-based judge servers (vLLM, SGLang), so a step never reuses a connection the
#: server has just closed (its request fails: "Can not write request body").
DEFAULT_KEEPALIVE_S = 4.0

#: The feedback a retry after a rejected answer adds after it (static text first,
#: then the reason: the prompt's cached prefix stays the same).
RETRY_NOTE = (
    "Your previous answer could not be used: {reason}. Answer again with one JSON object that follows the"
    " required format exactly, and keep the rationale short."
)


class NoAnswer(Exception):
    """The endpoint gave no answer: refused or dropped connection, timeout, 5xx.

    ``prompt_tokens``: after a timeout, the estimate of the prompt tokens the server
    took in (it had the request; no usage came back to say how many).
    """

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome = outcome
        self.prompt_tokens = 0


class RateLimited(Exception):
    def __init__(self, message: str, rates: RateHeaders):
        super().__init__(message)
        self.rates = rates


class BadRequest(Exception):
    """A 400: the server refused the request itself."""

    def __init__(self, message: str, body: Any):
        super().__init__(message)
        self.body = body


def response_format(mode: ResponseFormat, prompt: Prompt) -> dict[str, Any] | None:
    """The ``response_format`` a request carries in ``mode``."""
    if mode in ("auto", "json_schema"):
        return {
            "type": "json_schema",
            "json_schema": {"name": prompt.schema_name, "schema": prompt.schema, "strict": True},
        }
    if mode == "json_object":
        return {"type": "json_object"}
    return None


@dataclass
class FirstEvent:
    """Called when a streamed answer's first event comes (the server has prefilled the
    prompt): its seconds after the call went out, less the connection turns waited for
    (``queued``, this client's own queue), passed to ``tell`` at once."""

    tell: Callable[[float], None]
    started: float
    queued: list[float] = field(default_factory=lambda: [0.0])
    seconds: float | None = None

    def __call__(self) -> None:
        self.seconds = time.monotonic() - self.started - self.queued[0]
        self.tell(self.seconds)


async def post_chat(
    client: AsyncOpenAI,
    e: EndpointConfig,
    body: dict[str, Any],
    timeout_s: float,
    first_event: Callable[[], None] | None = None,
) -> tuple[bytes, httpx2.Headers, bool]:
    """Send one chat-completions request; the answer's body, its headers and whether it
    was streamed, or the kind of error it came to. With ``first_event`` the answer is
    asked as a stream and ``first_event`` is called when its first event comes (the
    server has prefilled the prompt); a server that answers in one body instead is read
    as one. The answer timeout bounds a streamed answer as a whole, not each event."""
    try:
        # The absolute URL spares the client joining a path to its base URL on every
        # call (6% of its CPU per judgment, python -m bench.judge_client).
        if first_event is None:
            response = await client.post(
                e.chat_url, content=orjson.dumps(body), options=request_options(), cast_to=httpx2.Response
            )
            return response.content, response.headers, False
        return await _streamed(client, e, body, timeout_s, first_event)
    except openai.APITimeoutError as exc:
        cause = exc.__cause__
        if type(cause).__name__ == "ConnectTimeout":
            # The connection was never made (the aiohttp transport reports a refused
            # connection this way too): the judge cannot be reached, it did not stall.
            raise NoAnswer("connection", f"connection error: {cause}") from exc
        raise NoAnswer("timeout", f"no answer within {timeout_s:g}s") from exc
    except openai.APIConnectionError as exc:
        cause = exc.__cause__ or exc
        raise NoAnswer("connection", f"connection error: {type(cause).__name__}: {cause}") from exc
    except openai.APIStatusError as exc:
        status = exc.status_code
        content = exc.response.content
        message = error_message(content, status)
        if status == 400:
            raise BadRequest(message, json_or_none(content)) from exc
        if status == 429:
            raise RateLimited(f"429: {message}", read_headers(exc.response.headers, 429)) from exc
        if status >= 500 or status in _RETRYABLE_STATUS:
            raise NoAnswer("server_error", f"{status}: {message}") from exc
        raise FatalJudgeError(f"{status}: {message}") from exc
    except httpx2.TransportError as exc:  # the stream broke off
        raise NoAnswer("connection", f"connection error: {type(exc).__name__}: {exc}") from exc


async def _streamed(
    client: AsyncOpenAI, e: EndpointConfig, body: dict[str, Any], timeout_s: float, first_event: Callable[[], None]
) -> tuple[bytes, httpx2.Headers, bool]:
    started = time.monotonic()
    stream = await client.post(
        e.chat_url,
        content=orjson.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}),
        options=request_options(),
        cast_to=object,
        stream=True,
        stream_cls=openai.AsyncStream[object],
    )
    try:
        headers = stream.response.headers
        if not headers.get("content-type", "").startswith("text/event-stream"):
            return await stream.response.aread(), headers, False
        try:
            async with asyncio.timeout(max(0.001, timeout_s - (time.monotonic() - started))):
                return await assembled(stream.response, first_event), headers, True
        except TimeoutError as exc:
            raise openai.APITimeoutError(request=stream.response.request) from exc
        except RetryableError as exc:  # an unreadable event
            exc.endpoint = e.url
            raise
    finally:
        await stream.close()


class StreamedBody:
    """A streamed chat completion's events added up, as they come, to the body a plain
    answer has (its content, finish reason, model, usage and llama.cpp's timings); an
    error event is a server error at once."""

    def __init__(self) -> None:
        self._content: list[str] = []
        self._finish: str | None = None
        self._out: dict[str, Any] = {}

    def add(self, event: Any) -> None:
        if not isinstance(event, dict):
            return
        if event.get("error"):
            error = event["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise NoAnswer("server_error", f"error in the streamed answer: {message}")
        for key in ("model", "usage", "timings"):
            if event.get(key):
                self._out[key] = event[key]
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self._content.append(delta["content"])
            self._finish = choice.get("finish_reason") or self._finish

    def body(self) -> dict[str, Any]:
        message = {"role": "assistant", "content": "".join(self._content)}
        return {**self._out, "choices": [{"index": 0, "finish_reason": self._finish, "message": message}]}


async def assembled(response: httpx2.Response, first_event: Callable[[], None]) -> bytes:
    """A streamed answer as the one body it adds up to (:class:`StreamedBody`);
    ``first_event`` is called as its first bytes come."""
    body = StreamedBody()
    async for event in sse_data(response, first_event):
        body.add(event)
    return orjson.dumps(body.body())


async def sse_data(response: httpx2.Response, first_event: Callable[[], None]) -> AsyncIterator[Any]:
    """The JSON of each ``data:`` line of a server-sent-events body, up to ``[DONE]``.

    Read here rather than by the client's own reader (``AsyncStream``), which took a
    judgment's client CPU from 1.09 to 1.52 ms (python -m bench.judge_client): chat
    completion events are one ``data:`` line each, parsed with orjson. A line that is
    not JSON is an invalid answer, like an unreadable body.
    """
    buffer = b""
    first = True
    async for chunk in response.aiter_bytes():
        if first:
            first_event()
            first = False
        buffer = (buffer + chunk).replace(b"\r\n", b"\n")
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, event names
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            try:
                yield orjson.loads(data)
            except orjson.JSONDecodeError as exc:
                raise RetryableError("invalid", f"unreadable streamed event: {data[:200]!r}") from exc


def messages_of(prompt: Prompt, plan: AttemptPlan) -> list[dict[str, str]]:
    messages = prompt.messages
    if plan.feedback is None:
        return messages
    text, reason = plan.feedback
    return [
        *messages,
        {"role": "assistant", "content": text},
        {"role": "user", "content": RETRY_NOTE.format(reason=reason)},
    ]


def names_format(message: str) -> bool:
    """Whether a 400 is about the structured-output request itself."""
    lower = message.lower()
    words = ("response_format", "json_schema", "json schema", "response format", "structured output")
    return any(word in lower for word in words)


def completion_of(raw: bytes, endpoint: str, max_tokens: int, context: int | None, context_bound: bool) -> Completion:
    """Read a chat-completions body; anything unreadable is an invalid answer (retried)."""
    try:
        body = orjson.loads(raw)
        choice = body["choices"][0]
        content = choice["message"].get("content") or ""
        usage = body.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        if cached is None:  # llama.cpp reports its prompt cache in its own timings
            cached = (body.get("timings") or {}).get("cache_n")
        return Completion(
            text=content if isinstance(content, str) else json.dumps(content),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            finish_reason=choice.get("finish_reason"),
            cached_tokens=int(cached or 0),
            endpoint=endpoint,
            model=body.get("model") if isinstance(body.get("model"), str) else None,
            max_tokens=max_tokens,
            context_tokens=context,
            context_bound=context_bound,
        )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise RetryableError("invalid", f"unreadable chat completion: {raw[:200]!r}", endpoint=endpoint) from exc


def json_or_none(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def error_message(raw: bytes, status: int) -> str:
    """The server's own error message (OpenAI's ``{"error": {"message": ...}}``), else the body."""
    try:
        body = json.loads(raw)
    except ValueError:
        text = raw.decode(errors="replace").strip()
        return text[:500] or f"HTTP {status}"
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and "message" in inner:
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return json.dumps(body)[:500]
