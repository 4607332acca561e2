"""Judge backend for any OpenAI-compatible chat-completions server (vLLM, SGLang,
llama.cpp, a hosted API), on one endpoint or a fleet of them.

Which endpoint takes a call, how many calls each is sent and at what pace is the
fleet's business (:mod:`drcredit.judges.fleet`); this module makes one exchange and
reads what came back. The transport is the official ``openai`` package's async client
on its aiohttp transport, with ``max_retries=0``: the shared loop in
:mod:`drcredit.judges.base` retries, records every attempt and tells an unreachable
judge from one that answered badly. Within one attempt a call that could not connect,
was cut off, timed out or got a 5xx moves to another endpoint at once, and a 429 waits
for its endpoint (or goes to another) without spending the attempt. The response body
is read as bytes and parsed here with orjson, so a malformed answer is an invalid
attempt, never an exception of the client's model layer.

The request goes through the client's generic ``post`` with the chat-completions body as
the wire format: its typed ``chat.completions.create`` costs several times the CPU of the
rest of a judgment (BENCHMARKS.md) for a body that needs no transformation.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from typing import Any, Literal

import httpx2
import openai
import orjson
from openai import AsyncOpenAI

from drcredit.judges.attempts import Attempt, AttemptPlan
from drcredit.judges.base import Completion, FatalJudgeError, Judge, Prompt, RetryableError, RetryPolicy
from drcredit.judges.context import MIN_ANSWER_TOKENS, TokenRatio, overflow_of, served_context
from drcredit.judges.fleet.endpoints import EndpointConfig, parse_endpoints
from drcredit.judges.fleet.rates import RateHeaders, RateLimits, read_headers
from drcredit.judges.fleet.router import AllEndpointsDown, Endpoint, Fleet, Lease
from drcredit.judges.fleet.store import FleetStore
from drcredit.judges.fleet.transport import ConnectPacer, http_client

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

#: Idle seconds before a pooled connection is dropped: under the 5 s keep-alive of
#: uvicorn-based judge servers (vLLM, SGLang), so a step never reuses a connection the
#: server has just closed (its request fails: "Can not write request body").
DEFAULT_KEEPALIVE_S = 4.0

#: The feedback a retry after a rejected answer adds after it (static text first,
#: then the reason: the prompt's cached prefix stays the same).
_RETRY_NOTE = (
    "Your previous answer could not be used: {reason}. Answer again with one JSON object that follows the"
    " required format exactly, and keep the rationale short."
)


class _NoAnswer(Exception):
    """The endpoint gave no answer: refused or dropped connection, timeout, 5xx.

    ``prompt_tokens``: after a timeout, the estimate of the prompt tokens the server
    took in (it had the request; no usage came back to say how many).
    """

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome = outcome
        self.prompt_tokens = 0


class _RateLimited(Exception):
    def __init__(self, message: str, rates: RateHeaders):
        super().__init__(message)
        self.rates = rates


class _BadRequest(Exception):
    """A 400: the server refused the request itself."""

    def __init__(self, message: str, body: Any):
        super().__init__(message)
        self.body = body


class OpenAIJudge(Judge):
    backend = "openai"

    def __init__(
        self,
        *,
        base_url: str | None,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        connect_timeout_s: float = 5.0,
        max_tokens: int = 1024,
        temperature: float = 0.0,
        response_format: ResponseFormat = "auto",
        extra_body: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        outage_deadline_s: float = 600.0,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        endpoints: tuple[EndpointConfig, ...] | None = None,
        store: FleetStore | None = None,
        rates: RateLimits = RateLimits(),
    ):
        self.endpoints = endpoints or parse_endpoints(base_url or os.environ.get("OPENAI_BASE_URL"))
        super().__init__(model, retry, outage_deadline_s, temperature)
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_tokens = max_tokens
        self.response_format: ResponseFormat = response_format
        self.extra_body = extra_body or {}
        self.keepalive_s = keepalive_s
        self.fleet: Fleet = Fleet(self.endpoints, store=store, configured=rates)
        #: Per endpoint: the structured output it takes (``auto`` until a 400 names it).
        self._formats: dict[str, ResponseFormat] = {e.url: response_format for e in self.endpoints}
        self._ratios: dict[str, TokenRatio] = {e.url: TokenRatio() for e in self.endpoints}
        self._discovered: dict[str, asyncio.Task[None]] = {}
        #: One client (and connection pool) per event loop and endpoint.
        self._clients: dict[tuple[asyncio.AbstractEventLoop, str], AsyncOpenAI] = {}
        self._pacers: dict[tuple[asyncio.AbstractEventLoop, str], ConnectPacer] = {}

    @property
    def base_url(self) -> str:
        """The first endpoint's URL (the whole fleet is :attr:`endpoint`)."""
        return self.endpoints[0].url

    @property
    def endpoint(self) -> str:
        return ",".join(e.url for e in self.endpoints)

    def response_format_of(self, url: str) -> ResponseFormat:
        return self._formats[url]

    # ------------------------------------------------------------------ clients

    def _client(self, e: EndpointConfig) -> AsyncOpenAI:
        loop = asyncio.get_running_loop()
        client = self._clients.get((loop, e.url))
        if client is None:
            pacer = self._pacers.setdefault((loop, e.url), ConnectPacer())
            client = AsyncOpenAI(
                api_key=e.api_key or self.api_key,
                base_url=e.url,
                timeout=httpx2.Timeout(self.timeout_s, connect=self.connect_timeout_s),
                max_retries=0,
                http_client=http_client(
                    pacer,
                    answer_timeout_s=self.timeout_s,
                    connect_timeout_s=self.connect_timeout_s,
                    keepalive_s=self.keepalive_s,
                ),
                default_headers=_QUIET_HEADERS,
            )
            self._clients[(loop, e.url)] = client
        return client

    def connect_pacer(self, url: str) -> ConnectPacer | None:
        """The connection pacing of ``url`` on the running loop (None before its first call)."""
        return self._pacers.get((asyncio.get_running_loop(), url))

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        for key in [k for k in self._clients if k[0] is loop]:
            await self._clients.pop(key).close()
            self._pacers.pop(key, None)
        self._discovered.clear()
        await self.fleet.aclose()

    def close(self) -> None:
        # Clients of loops still running are closed by their owner (the engine calls
        # aclose on its loop before stopping); what is left belongs to finished loops.
        self._clients = {k: c for k, c in self._clients.items() if not k[0].is_closed()}
        self._pacers = {k: g for k, g in self._pacers.items() if not k[0].is_closed()}

    # ------------------------------------------------------------------ one attempt

    async def acomplete(self, prompt: Prompt, plan: AttemptPlan) -> Completion:
        """One attempt: over the fleet until an endpoint answers or every one refused."""
        failed: frozenset[str] = frozenset()
        limited_since: float | None = None
        if len(self._discovered) < len(self.endpoints):
            await asyncio.gather(*(self._discover(e) for e in self.endpoints))
        while True:
            try:
                lease = await self.fleet.acquire(exclude=failed, force_probe=plan.probe)
            except AllEndpointsDown as exc:
                last = plan.tries.pop() if plan.tries and plan.tries[-1].outcome != "rate_limited" else None
                if last is not None and last.error is not None:
                    raise RetryableError(
                        last.outcome, last.error, prompt_tokens=last.prompt_tokens, endpoint=last.endpoint
                    ) from exc
                raise RetryableError("connection", f"no judge endpoint can be reached ({exc})") from exc
            e = lease.endpoint
            started = time.monotonic()
            try:
                return await self._exchange(lease, prompt, plan)
            except _RateLimited as exc:
                self.fleet.rate_limited(lease, exc.rates)
                plan.tries.append(self._try("rate_limited", started, str(exc), e))
                limited_since = limited_since or started
                if time.monotonic() - limited_since > self.timeout_s:
                    raise RetryableError("rate_limited", f"rate limited for over {self.timeout_s:g} s: {exc}") from exc
            except _NoAnswer as exc:
                self.fleet.failed(lease, exc.outcome, str(exc))
                failed |= {e.url}
                if len(failed) == len(self.endpoints):
                    raise RetryableError(
                        exc.outcome, str(exc), prompt_tokens=exc.prompt_tokens, endpoint=e.url
                    ) from exc
                plan.tries.append(self._try(exc.outcome, started, str(exc), e, exc.prompt_tokens))
            finally:
                self.fleet.release(lease)

    @staticmethod
    def _try(outcome: str, started: float, error: str, e: Endpoint, prompt_tokens: int = 0) -> Attempt:
        return Attempt(
            0,
            outcome,
            time.monotonic() - started,
            prompt_tokens,
            error=error,
            endpoint=e.url,
            spent=False,
            estimated=prompt_tokens > 0,
        )

    async def _exchange(self, lease: Lease, prompt: Prompt, plan: AttemptPlan) -> Completion:
        """Send to the leased endpoint, resending at once when its 400 says how to fix
        the request (no structured output; less room for the answer)."""
        e = lease.endpoint
        config = e.config
        messages = _messages(prompt, plan)
        chars = sum(len(m["content"]) for m in messages)
        ratio = self._ratios[config.url]
        context = e.record.context_tokens or config.context_tokens
        max_tokens = plan.max_tokens or self.max_tokens
        if context:
            fewest = ratio.fewest(chars)
            if fewest + MIN_ANSWER_TOKENS > context:
                raise FatalJudgeError(_too_long(fewest, context, config.url, estimated=True), "context_length")
            max_tokens = max(MIN_ANSWER_TOKENS, min(max_tokens, context - ratio.most(chars)))
        await self.fleet.pace(lease, ratio.most(chars) + max_tokens)
        while True:
            response_format = self._format_for(config.url, prompt)
            started = time.monotonic()
            try:
                raw, headers = await self._post(config, messages, plan.temperature, max_tokens, response_format)
            except _BadRequest as exc:
                self.fleet.answered(lease, None)
                overflow = overflow_of(exc.body, str(exc))
                if overflow is not None:
                    self.fleet.learn(config.url, context_tokens=overflow.context_tokens)
                    prompt_tokens = overflow.prompt_tokens
                    if prompt_tokens is None or prompt_tokens + MIN_ANSWER_TOKENS > overflow.context_tokens:
                        needed = prompt_tokens if prompt_tokens is not None else ratio.fewest(chars)
                        raise FatalJudgeError(
                            _too_long(needed, overflow.context_tokens, config.url, estimated=prompt_tokens is None),
                            "context_length",
                        ) from exc
                    ratio.observe(chars, prompt_tokens)
                    if max_tokens > overflow.context_tokens - prompt_tokens:
                        max_tokens = overflow.context_tokens - prompt_tokens
                        plan.tries.append(self._try("context_length", started, str(exc), e))
                        continue
                if response_format is not None and self._formats[config.url] == "auto" and _names_format(str(exc)):
                    # The server lacks structured output: plain JSON in the text, for
                    # this endpoint only, decided from what it said about response_format.
                    self._formats[config.url] = "none"
                    plan.tries.append(self._try("invalid", started, str(exc), e))
                    continue
                raise FatalJudgeError(f"bad request: {exc}") from exc
            except FatalJudgeError:
                self.fleet.answered(lease, None)
                raise
            except _NoAnswer as exc:
                if exc.outcome == "timeout":
                    # The server had the whole prompt when the call was cut off: its tokens
                    # are spent though no usage came back. Counted at the most it can be.
                    exc.prompt_tokens = ratio.most(chars)
                raise
            self.fleet.answered(lease, time.monotonic() - started, read_headers(headers, 200))
            completion = _completion(raw, config.url, max_tokens, context)
            ratio.observe(chars, completion.prompt_tokens)
            if lease.reserved_tokens:
                await self.fleet.settle_tokens(lease, completion.prompt_tokens + completion.completion_tokens)
            return completion

    def _format_for(self, url: str, prompt: Prompt) -> dict[str, Any] | None:
        mode = self._formats[url]
        if mode in ("auto", "json_schema"):
            return {
                "type": "json_schema",
                "json_schema": {"name": prompt.schema_name, "schema": prompt.schema, "strict": True},
            }
        if mode == "json_object":
            return {"type": "json_object"}
        return None

    async def _post(
        self,
        e: EndpointConfig,
        messages: list[dict[str, str]],
        temperature: float,
        max_tokens: int,
        response_format: dict[str, Any] | None,
    ) -> tuple[bytes, httpx2.Headers]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
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
            response = await self._client(e).post(
                e.chat_url, content=orjson.dumps(body), options=_options(), cast_to=httpx2.Response
            )
        except openai.APITimeoutError as exc:
            cause = exc.__cause__
            if type(cause).__name__ == "ConnectTimeout":
                # The connection was never made (the aiohttp transport reports a refused
                # connection this way too): the judge cannot be reached, it did not stall.
                raise _NoAnswer("connection", f"connection error: {cause}") from exc
            raise _NoAnswer("timeout", f"no answer within {self.timeout_s:g}s") from exc
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise _NoAnswer("connection", f"connection error: {type(cause).__name__}: {cause}") from exc
        except openai.APIStatusError as exc:
            status = exc.status_code
            content = exc.response.content
            message = _error_message(content, status)
            if status == 400:
                raise _BadRequest(message, _json_or_none(content)) from exc
            if status == 429:
                raise _RateLimited(f"429: {message}", read_headers(exc.response.headers, 429)) from exc
            if status >= 500 or status in _RETRYABLE_STATUS:
                raise _NoAnswer("server_error", f"{status}: {message}") from exc
            raise FatalJudgeError(f"{status}: {message}") from exc
        return response.content, response.headers

    # ------------------------------------------------------------------ what the server says of itself

    async def _discover(self, e: EndpointConfig) -> None:
        """Ask the endpoint once for its context window and slots (llama.cpp, vLLM)."""
        task = self._discovered.get(e.url)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._ask_server(e))
            self._discovered[e.url] = task
        await asyncio.shield(task)

    async def _ask_server(self, e: EndpointConfig) -> None:
        client = self._client(e)
        models = await _get_json(client, e.url + "/models")
        root = e.url[: -len("/v1")] if e.url.endswith("/v1") else e.url
        props = await _get_json(client, root + "/props")
        context, slots = served_context(models, props)
        if context or slots:
            self.fleet.learn(e.url, context_tokens=context, slots=slots)


async def _get_json(client: AsyncOpenAI, url: str) -> Any:
    try:
        response = await client.get(url, cast_to=httpx2.Response, options={"max_retries": 0, "timeout": 5.0})
        return orjson.loads(response.content)
    except Exception:  # noqa: BLE001 - the server need not say: the platform learns from its answers
        return None


def _messages(prompt: Prompt, plan: AttemptPlan) -> list[dict[str, str]]:
    messages = prompt.messages
    if plan.feedback is None:
        return messages
    text, reason = plan.feedback
    return [
        *messages,
        {"role": "assistant", "content": text},
        {"role": "user", "content": _RETRY_NOTE.format(reason=reason)},
    ]


def _too_long(needed: int, context: int, url: str, *, estimated: bool) -> str:
    about = "about " if estimated else ""
    return (
        f"the prompt needs {about}{needed} tokens and the context of {url} holds {context}"
        f" (with at least {MIN_ANSWER_TOKENS} for the answer): give the judge a larger context per request"
        " (llama.cpp: -c divided by --parallel; vLLM: --max-model-len) or shorter page evidence"
    )


def _names_format(message: str) -> bool:
    """Whether a 400 is about the structured-output request itself."""
    lower = message.lower()
    return any(word in lower for word in ("response_format", "json_schema", "response format", "structured output"))


def _completion(raw: bytes, endpoint: str, max_tokens: int, context: int | None) -> Completion:
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
        )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise RetryableError("invalid", f"unreadable chat completion: {raw[:200]!r}") from exc


def _json_or_none(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


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
