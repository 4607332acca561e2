"""Judge backend for any OpenAI-compatible chat-completions server (vLLM, SGLang,
llama.cpp, a hosted API), on one endpoint or a fleet of them.

Which endpoint takes a call, how many calls each is sent and at what pace is the
fleet's business (:mod:`drcredit.judges.fleet`); the wire format and its errors are
:mod:`drcredit.judges.openai_wire`'s; what each server says of itself (its context, its
slots, a prompt's tokens) :mod:`drcredit.judges.server_facts`'. This module makes one
attempt. The transport is the official ``openai`` package's async client on its aiohttp
transport, with ``max_retries=0``: the shared loop in :mod:`drcredit.judges.base`
retries, records every attempt and tells an unreachable judge from one that answered
badly. Within one attempt a call that could not connect, was cut off, timed out or got a
5xx moves to another endpoint at once, and a 429 waits for its endpoint (or goes to
another) without spending the attempt. The room for the answer is what the context
leaves after the prompt, counted by the server when the estimate is in doubt.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from dataclasses import replace
from typing import Any

import httpx2
from openai import AsyncOpenAI

from drcredit.judges.attempts import Attempt, AttemptPlan
from drcredit.judges.base import Completion, FatalJudgeError, Judge, Prompt, RetryableError, RetryPolicy
from drcredit.judges.context import MIN_ANSWER_TOKENS, TokenRatio, overflow_of, too_long
from drcredit.judges.fleet.affinity import CALL_AFFINITY, affinity_key, slot_of
from drcredit.judges.fleet.endpoints import EndpointConfig, parse_endpoints
from drcredit.judges.fleet.rates import RateLimits, read_headers
from drcredit.judges.fleet.router import AllEndpointsDown, Endpoint, Fleet, Lease
from drcredit.judges.fleet.store import FleetStore
from drcredit.judges.fleet.transport import ConnectPacer, http_client, turn_waits
from drcredit.judges.openai_wire import (
    DEFAULT_KEEPALIVE_S,
    QUIET_HEADERS,
    BadRequest,
    FirstEvent,
    NoAnswer,
    RateLimited,
    ResponseFormat,
    completion_of,
    messages_of,
    names_format,
    post_chat,
    response_format,
)
from drcredit.judges.prompts import DEFAULT_LAYOUT
from drcredit.judges.server_facts import ServerFacts
from drcredit.tenancy.shares import Shares

__all__ = ["DEFAULT_KEEPALIVE_S", "OpenAIJudge", "ResponseFormat"]


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
        fleet: Fleet | None = None,
        prompt_layout: str = DEFAULT_LAYOUT,
        shares: Shares | None = None,
    ):
        self.endpoints = endpoints or parse_endpoints(base_url or os.environ.get("OPENAI_BASE_URL"))
        super().__init__(model, retry, outage_deadline_s, temperature, prompt_layout)
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_tokens = max_tokens
        self.response_format: ResponseFormat = response_format
        self.extra_body = extra_body or {}
        self.keepalive_s = keepalive_s
        #: Its endpoints' fleet: its own, or one shared with another judge on the same endpoints.
        self._owns_fleet = fleet is None
        self.fleet: Fleet = fleet or Fleet(
            self.endpoints, store=store, configured=rates, prober=self._health_check, shares=shares
        )
        self.facts = ServerFacts(self.fleet, self._client, model, connect_timeout_s)
        #: Per endpoint: the structured output it takes (``auto`` until a 400 names it).
        self._formats: dict[str, ResponseFormat] = {e.url: response_format for e in self.endpoints}
        self._ratios: dict[str, TokenRatio] = {e.url: TokenRatio() for e in self.endpoints}
        #: Per endpoint: this process's calls in flight on each llama.cpp slot it named,
        #: and the affinity key of the last one sent there.
        self._slots_busy: dict[str, dict[int, tuple[int, str | None]]] = {}
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

    @property
    def sampling(self) -> dict[str, Any]:
        # top_p, seed and the like reach the server through the extra body.
        return {
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "response_format": self.response_format,
            "extra_body": self.extra_body,
        }

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
                default_headers=QUIET_HEADERS,
            )
            self._clients[(loop, e.url)] = client
        return client

    def connect_pacer(self, url: str) -> ConnectPacer | None:
        """The connection pacing of ``url`` on the running loop (None before its first call)."""
        return self._pacers.get((asyncio.get_running_loop(), url))

    async def awarm(self) -> None:
        # Asking the servers what they serve and building the clients at a fresh worker's
        # first call held every chain of its first step 0.3-0.6 s (measured, round 28).
        await self.facts.warm()

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        for key in [k for k in self._clients if k[0] is loop]:
            await self._clients.pop(key).close()
            self._pacers.pop(key, None)
        self.facts.forget()
        if self._owns_fleet:
            await self.fleet.aclose()

    def close(self) -> None:
        # Clients of loops still running are closed by their owner (the engine calls
        # aclose on its loop before stopping); what is left belongs to finished loops.
        self._clients = {k: c for k, c in self._clients.items() if not k[0].is_closed()}
        self._pacers = {k: g for k, g in self._pacers.items() if not k[0].is_closed()}

    # ------------------------------------------------------------------ one attempt

    async def acomplete(self, prompt: Prompt, plan: AttemptPlan) -> Completion:
        """One attempt: over the fleet until an endpoint answers or every one refused.
        Calls sharing a prompt prefix are steered to one replica (and slot) where they
        can (:mod:`drcredit.judges.fleet.affinity`)."""
        key = affinity_key(prompt.shared_prefix) if prompt.shared_chars else None
        token = CALL_AFFINITY.set(key)
        try:
            return await self._acomplete(prompt, plan, key)
        finally:
            CALL_AFFINITY.reset(token)

    async def _acomplete(self, prompt: Prompt, plan: AttemptPlan, key: str | None) -> Completion:
        failed: frozenset[str] = frozenset()
        limited_since: float | None = None
        began = time.monotonic()
        if not self.facts.complete:
            await self.facts.ask_all()
        while True:
            # Endpoints that gave this judgment a rejected answer only when nothing else can.
            avoid = plan.avoid - failed
            if avoid and not self.fleet.takes_calls(exclude=failed | avoid):
                avoid = frozenset()
            try:
                lease = await self.fleet.acquire(exclude=failed | avoid, force_probe=plan.probe)
            except AllEndpointsDown as exc:
                last = plan.tries.pop() if plan.tries and plan.tries[-1].outcome != "rate_limited" else None
                if last is not None and last.error is not None:
                    raise RetryableError(
                        last.outcome, last.error, prompt_tokens=last.prompt_tokens, endpoint=last.endpoint
                    ) from exc
                raise RetryableError("connection", f"no judge endpoint can be reached ({exc})") from exc
            e = lease.endpoint
            started = time.monotonic()
            hold_off = 0.0
            try:
                completion, answered_in = await self._exchange(lease, prompt, plan, key)
                # Everything but the answering exchange's own time was spent on this side.
                return replace(completion, waited_s=max(0.0, time.monotonic() - began - answered_in))
            except RateLimited as exc:
                hold_off = self.fleet.rate_limited(lease, exc.rates)
                await self.fleet.refused(lease)
                plan.tries.append(self._try("rate_limited", started, str(exc), e))
                limited_since = limited_since or started
                if time.monotonic() - limited_since > self.timeout_s:
                    raise RetryableError("rate_limited", f"rate limited for over {self.timeout_s:g} s: {exc}") from exc
            except NoAnswer as exc:
                self.fleet.failed(lease, exc.outcome, str(exc))
                failed |= {e.url}
                if len(failed) == len(self.endpoints):
                    raise RetryableError(
                        exc.outcome, str(exc), prompt_tokens=exc.prompt_tokens, endpoint=e.url
                    ) from exc
                plan.tries.append(self._try(exc.outcome, started, str(exc), e, exc.prompt_tokens))
            finally:
                self.fleet.release(lease)
            if hold_off > 0:
                await asyncio.sleep(hold_off)  # the refused call honours its retry-after

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

    async def _exchange(
        self, lease: Lease, prompt: Prompt, plan: AttemptPlan, key: str | None = None
    ) -> tuple[Completion, float]:
        """Send to the leased endpoint, resending at once when its 400 says how to fix
        the request (no structured output; less room for the answer). Returns the answer
        and the seconds the server took over it (the connection turn waited for left out)."""
        e = lease.endpoint
        config = e.config
        messages = messages_of(prompt, plan)
        chars = sum(len(m["content"]) for m in messages)
        ratio = self._ratios[config.url]
        context = e.record.context_tokens or config.context_tokens
        # A retry's room is never less than the setting's: an answer cut off where the
        # context's estimate bounded it is asked again with what is known now.
        wanted = max(plan.max_tokens or 0, self.max_tokens)
        max_tokens = wanted
        if context:
            fewest = ratio.fewest(chars)
            if fewest + MIN_ANSWER_TOKENS > context:
                raise FatalJudgeError(too_long(fewest, context, config.url, estimated=True), "context_length")
            most = ratio.most(chars)
            if context - most < wanted:
                # The estimate leaves less room than asked for: the server's own count
                # decides (a prompt that fits is not refused, an answer not cut short).
                counted = await self.facts.count_tokens(config, messages)
                if counted is not None:
                    ratio.observe(chars, counted)
                    if counted + MIN_ANSWER_TOKENS > context:
                        raise FatalJudgeError(too_long(counted, context, config.url, estimated=False), "context_length")
                    most = counted
            max_tokens = min(max_tokens, max(MIN_ANSWER_TOKENS, context - most))
        await self.fleet.pace(lease, ratio.most(chars) + max_tokens)
        while True:
            wanted_format = response_format(self._formats[config.url], prompt)
            started = time.monotonic()
            first = FirstEvent(functools.partial(self.fleet.first_event, lease), started)
            try:
                slot = self._slot(e, key)
                busy = self._slots_busy.setdefault(config.url, {})
                if slot is not None:
                    busy[slot] = (busy.get(slot, (0, None))[0] + 1, key)
                try:
                    with turn_waits() as queued:
                        first.queued = queued
                        raw, headers, streamed = await post_chat(
                            self._client(config),
                            config,
                            self._body(messages, plan.temperature, max_tokens, wanted_format, slot),
                            self.timeout_s,
                            first if config.stream else None,
                        )
                finally:
                    if slot is not None:
                        calls, holder = busy[slot]
                        busy[slot] = (calls - 1, holder)
            except BadRequest as exc:
                self.fleet.answered(lease, None)
                overflow = overflow_of(exc.body, str(exc))
                if overflow is not None:
                    self.fleet.learn(config.url, context_tokens=overflow.context_tokens)
                    prompt_tokens = overflow.prompt_tokens
                    if prompt_tokens is not None:
                        ratio.observe(chars, prompt_tokens)  # the next prompt this long is refused here
                    if prompt_tokens is None or prompt_tokens + MIN_ANSWER_TOKENS > overflow.context_tokens:
                        needed = prompt_tokens if prompt_tokens is not None else ratio.fewest(chars)
                        raise FatalJudgeError(
                            too_long(needed, overflow.context_tokens, config.url, estimated=prompt_tokens is None),
                            "context_length",
                        ) from exc
                    if max_tokens > overflow.context_tokens - prompt_tokens:
                        max_tokens = overflow.context_tokens - prompt_tokens
                        plan.tries.append(self._try("context_length", started, str(exc), e))
                        continue
                if wanted_format is not None and self._formats[config.url] == "auto" and names_format(str(exc)):
                    # The server lacks structured output: plain JSON in the text, for
                    # this endpoint only, decided from what it said about response_format.
                    self._formats[config.url] = "none"
                    plan.tries.append(self._try("invalid", started, str(exc), e))
                    continue
                raise FatalJudgeError(f"bad request: {exc}") from exc
            except FatalJudgeError:
                self.fleet.answered(lease, None)
                raise
            except NoAnswer as exc:
                if exc.outcome == "timeout":
                    # The server had the whole prompt when the call was cut off: its tokens
                    # are spent though no usage came back. Counted at the most it can be.
                    exc.prompt_tokens = ratio.most(chars)
                raise
            # The server's latency: the wait for a connection turn was this client's.
            answered_in = time.monotonic() - started - queued[0]
            self.fleet.answered(
                lease, answered_in, read_headers(headers, 200), first_s=first.seconds if streamed else None
            )
            completion = completion_of(raw, config.url, max_tokens, context, max_tokens < wanted)
            ratio.observe(chars, completion.prompt_tokens)
            if lease.reserved_tokens:
                await self.fleet.settle_tokens(lease, completion.prompt_tokens + completion.completion_tokens)
            return completion, answered_in

    def _body(
        self,
        messages: list[dict[str, str]],
        temperature: float,
        max_tokens: int,
        wanted_format: dict[str, Any] | None,
        slot: int | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        if wanted_format is not None:
            body["response_format"] = wanted_format
        if slot is not None:
            # llama.cpp: the slot whose prompt cache holds this call's shared prefix.
            body["id_slot"] = slot
            body["cache_prompt"] = True
        body.update(self.extra_body)
        return body

    def _slot(self, e: Endpoint, key: str | None) -> int | None:
        """The llama.cpp slot for a call with affinity ``key`` (None: the server picks),
        only where the server said how many slots it has. The key's slot when it is free
        or busy with the same prefix (the server holds the call until the slot frees, and
        then has the prefix cached); when another prefix holds it, a free slot, so one
        slot does not queue calls while another idles."""
        preferred = slot_of(key, e.record.slots)
        if preferred is None:
            return None
        busy = self._slots_busy.setdefault(e.url, {})
        calls, holder = busy.get(preferred, (0, None))
        if calls == 0 or holder == key:
            return preferred
        free = [k for k in range(e.record.slots or 0) if busy.get(k, (0, None))[0] == 0]
        return free[0] if free else preferred

    async def _health_check(self, e: EndpointConfig) -> str | None:
        return await self.facts.health_check(e)
