"""Judge backend for any OpenAI-compatible chat-completions server (vLLM, SGLang, OpenAI).

The transport is the official ``openai`` package's async client, on its aiohttp transport
(``openai[aiohttp]``: 0.66 ms of CPU per judgment against 1.27 ms on its default one,
``python -m bench.judge_client``), with ``max_retries=0``: the shared loop in
:mod:`drcredit.judges.base` retries, records every attempt and tells an unreachable judge
from one that answered badly. The response body is read as bytes (``cast_to=bytes``) and
parsed here with orjson, so a malformed answer is an invalid attempt, never an exception
of the client's model layer. Each error the client raises maps to one attempt outcome:
connection, timeout, 429, 5xx (and 408/409/425) are retried; 400 may drop the structured
output request; any other 4xx is fatal.

The request goes through the client's generic ``post`` with the chat-completions body as
the wire format: its typed ``chat.completions.create`` costs several times the CPU of the
rest of a judgment (BENCHMARKS.md) for a body that needs no transformation.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import threading
from typing import Any, Literal

import httpx2
import openai
import orjson
from openai import AsyncOpenAI

from drcredit.judges.base import Completion, FatalJudgeError, Judge, Prompt, RetryableError, RetryPolicy

ResponseFormat = Literal["auto", "json_schema", "json_object", "none"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"

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


def _options() -> Any:
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


class BadRequest(Exception):
    """The server refused the request itself (400), e.g. a response_format it lacks."""


#: The client's telemetry headers, left out (an ``Omit`` value removes a default
#: header): each header is normalized and merged again for every request, and these
#: seven were a fifth of the client's CPU per judgment. Nothing a judge server reads.
_QUIET_HEADERS: Any = {
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

#: Connections one client may open: beyond any judge concurrency (the platform's own
#: slots decide what is in flight). The client's default is 1,000, and no number at all
#: leaves aiohttp's own default of 100, which capped a worker at 100 calls in flight.
MAX_CONNECTIONS = 65536


#: Idle seconds before a pooled connection is dropped: under the 5 s keep-alive of
#: uvicorn-based judge servers (vLLM, SGLang), so a step never reuses a connection the
#: server has just closed (its request fails: "Can not write request body").
DEFAULT_KEEPALIVE_S = 4.0


def _http_client(keepalive_s: float) -> Any:
    """The client's aiohttp transport (measured cheaper per call than its default one)."""
    return openai.DefaultAioHttpClient(
        limits=httpx2.Limits(
            max_connections=MAX_CONNECTIONS, max_keepalive_connections=None, keepalive_expiry=keepalive_s
        )
    )


class OpenAIJudge(Judge):
    backend = "openai"

    def __init__(
        self,
        *,
        base_url: str | None,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        max_tokens: int = 1024,
        temperature: float = 0.0,
        response_format: ResponseFormat = "auto",
        extra_body: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        outage_deadline_s: float = 600.0,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
    ):
        base = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        self.base_url = base.rstrip("/")
        super().__init__(model, retry, outage_deadline_s)
        self.url = self.base_url + "/chat/completions"
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.response_format: ResponseFormat = response_format
        self.extra_body = extra_body or {}
        self.keepalive_s = keepalive_s
        #: One client (and connection pool) per event loop: the worker's engine loop, or
        #: a short-lived loop of a synchronous call.
        self._clients: dict[asyncio.AbstractEventLoop, AsyncOpenAI] = {}
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return self.base_url

    def _client(self) -> AsyncOpenAI:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = AsyncOpenAI(
                api_key=self.api_key,
                base_url=self.base_url,
                timeout=self.timeout_s,
                max_retries=0,
                http_client=_http_client(self.keepalive_s),
                default_headers=_QUIET_HEADERS,
            )
            with self._lock:
                self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        with self._lock:
            client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    def close(self) -> None:
        # Clients of loops still running are closed by their owner (the engine calls
        # aclose on its loop before stopping); what is left belongs to finished loops.
        with self._lock:
            self._clients = {loop: c for loop, c in self._clients.items() if not loop.is_closed()}

    def _format_for(self, prompt: Prompt) -> dict[str, Any] | None:
        mode = self.response_format
        if mode in ("auto", "json_schema"):
            return {
                "type": "json_schema",
                "json_schema": {"name": prompt.schema_name, "schema": prompt.schema, "strict": True},
            }
        if mode == "json_object":
            return {"type": "json_object"}
        return None

    async def acomplete(self, prompt: Prompt) -> Completion:
        response_format = self._format_for(prompt)
        try:
            return await self._post(prompt, response_format)
        except BadRequest as exc:
            # A server without structured output support answers 400 to the
            # response_format; in ``auto`` mode fall back to parsing JSON from plain text
            # for this and every later call.
            if response_format is not None and self.response_format == "auto":
                self.response_format = "none"
                try:
                    return await self._post(prompt, None)
                except BadRequest as again:
                    raise FatalJudgeError(f"bad request: {again}") from again
            raise FatalJudgeError(f"bad request: {exc}") from exc

    async def _post(self, prompt: Prompt, response_format: dict[str, Any] | None) -> Completion:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": prompt.messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if response_format is not None:
            body["response_format"] = response_format
        body.update(self.extra_body)
        try:
            # The client's generic POST, not ``chat.completions.create``: create walks
            # every message and the JSON schema through its typed-params transform, 2 ms
            # of CPU per call; the body here is already the wire format (BENCHMARKS.md).
            # The absolute URL spares the client joining a path to its base URL on every
            # call (6% of its CPU per judgment, python -m bench.judge_client).
            raw = await self._client().post(self.url, content=orjson.dumps(body), options=_options(), cast_to=bytes)
        except openai.APITimeoutError as exc:
            cause = exc.__cause__
            if type(cause).__name__ == "ConnectTimeout":
                # The connection was never made (the aiohttp transport reports a refused
                # connection this way too): the judge cannot be reached, it did not stall.
                raise RetryableError("connection", f"connection error: {cause}") from exc
            raise RetryableError("timeout", f"no answer within {self.timeout_s}s") from exc
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise RetryableError("connection", f"connection error: {type(cause).__name__}: {cause}") from exc
        except openai.APIStatusError as exc:
            status = exc.status_code
            message = _error_message(exc.response.content, status)
            if status == 400:
                raise BadRequest(message) from exc
            if status == 429:
                raise RetryableError("rate_limited", f"429: {message}") from exc
            if status >= 500 or status in _RETRYABLE_STATUS:
                raise RetryableError("server_error", f"{status}: {message}") from exc
            raise FatalJudgeError(f"{status}: {message}") from exc
        return _completion(raw)


def _completion(raw: bytes) -> Completion:
    """Read a chat-completions body; anything unreadable is an invalid answer (retried)."""
    try:
        body = orjson.loads(raw)
        choice = body["choices"][0]
        content = choice["message"].get("content") or ""
        usage = body.get("usage") or {}
        return Completion(
            text=content if isinstance(content, str) else json.dumps(content),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            finish_reason=choice.get("finish_reason"),
        )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise RetryableError("invalid", f"unreadable chat completion: {raw[:200]!r}") from exc


def _error_message(raw: bytes, status: int) -> str:
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
