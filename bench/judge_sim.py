"""A simulated OpenAI-compatible judge, run as its own process.

It answers valid judgments deterministically from the request content
(:mod:`bench.judge_answers`). Latency is fixed or lognormal, concurrency can be capped, a share of requests
can fail with 500; requests and tokens are counted and served at ``/stats``. ``POST
/garbage?seconds=S`` makes it answer garbage for S seconds (for :mod:`bench.faults`): a
chat completion whose content is not JSON, JSON that is no judgment, or a body that is
no chat completion at all, in turn.

The judges users run are simulated too (``bench.run --judge``): a small server with a
short listen queue and no keep-alive (``--backlog 5 --no-keepalive``), a hosted API
under a request quota (``--rate 150``: a token bucket; 429 with ``retry-after`` past
it, and with ``--rate-headers`` OpenAI's ``x-ratelimit-*`` headers on every answer),
a server that queues (``--slots 32``: :mod:`bench.queueing_server`). A request that asks
``stream`` is answered with server-sent events, the first sent once its prompt is
prefilled (after its wait for a slot and the prefill lane), as servers send the first
token.

    python -m bench.judge_sim --port 9100 --latency 1.0 [--lognormal-sigma 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import orjson
import uvicorn

from bench import prefix_cache
from bench.judge_answers import ANSWERS, kind_of
from bench.queueing_server import QueueingServer, watch_disconnect


class Quota:
    """A token bucket of ``rate`` requests a second holding up to ``burst``."""

    def __init__(self, rate: float, burst: float, headers: bool):
        self.rate, self.burst, self.headers = rate, burst, headers
        self.tokens, self.at = burst, time.monotonic()

    def take(self) -> tuple[bool, list[tuple[bytes, bytes]]]:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        allowed = self.tokens >= 1
        if allowed:
            self.tokens -= 1
        out: list[tuple[bytes, bytes]] = []
        if self.headers:
            out += [
                (b"x-ratelimit-limit-requests", str(int(self.rate * 60)).encode()),
                (b"x-ratelimit-remaining-requests", str(int(self.tokens)).encode()),
                (b"x-ratelimit-reset-requests", f"{(self.burst - self.tokens) / self.rate:.3f}s".encode()),
            ]
        if not allowed:
            wait = (1 - self.tokens) / self.rate
            out += [(b"retry-after", str(max(1, math.ceil(wait))).encode())]
            if self.headers:
                out += [(b"retry-after-ms", str(max(1, round(wait * 1000))).encode())]
        return allowed, out


class Simulator:
    def __init__(
        self,
        latency: float,
        sigma: float,
        concurrency: int,
        error_rate: float,
        seed: int,
        quota: Quota | None = None,
        prefix: prefix_cache.PrefixCache | None = None,
        queue: QueueingServer | None = None,
    ):
        self.latency, self.sigma, self.error_rate = latency, sigma, error_rate
        #: The replica's prefix cache and prefill cost (None: neither).
        self.prefix = prefix
        self.rng = random.Random(seed)
        self.slots = asyncio.Semaphore(concurrency) if concurrency > 0 else None
        self.quota = quota
        self.queue = queue
        self.stats = {
            "requests": 0,
            "visit": 0,
            "snippet": 0,
            "rubric": 0,
            "citation": 0,
            "errors": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "in_flight": 0,
            "peak_in_flight": 0,
            # Accepted and not yet answered: waiting for one of --concurrency's slots or in one.
            "open": 0,
            "peak_open": 0,
            "rate_limited": 0,
            "garbage": 0,
            "started": time.time(),
        }
        #: Until when (monotonic clock) every answer is garbage.
        self.garbage_until = 0.0

    def delay(self) -> float:
        if self.latency <= 0:
            return 0.0
        if self.sigma > 0:
            # Lognormal with the given median latency.
            return self.latency * self.rng.lognormvariate(0.0, self.sigma)
        return self.latency

    async def completion(
        self, raw: bytes, prefilled: Callable[[], Awaitable[None]] | None = None
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        """One chat completion: (status, body, extra headers). ``prefilled``, for a
        streamed request, is awaited once the prompt is prefilled (the first token)."""
        quota: list[tuple[bytes, bytes]] = []
        if self.quota is not None:
            allowed, quota = self.quota.take()
            if not allowed:
                self.stats["rate_limited"] += 1
                return 429, b'{"error": {"message": "rate limit reached", "type": "requests"}}', quota
        body = orjson.loads(raw)
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        doc = orjson.loads(user)
        kind = kind_of(doc)
        self.stats["requests"] += 1
        self.stats[kind] += 1
        if self.error_rate and self.rng.random() < self.error_rate:
            self.stats["errors"] += 1
            return 500, orjson.dumps({"error": {"message": "simulated failure"}}), quota
        if time.monotonic() < self.garbage_until:
            self.stats["garbage"] += 1
            return 200, self.garbage(body), quota
        prompt_tokens = sum(len(m["content"]) for m in body["messages"]) // 4
        self.stats["open"] += 1
        self.stats["peak_open"] = max(self.stats["peak_open"], self.stats["open"])
        if self.slots is not None:
            try:
                await self.slots.acquire()
            except BaseException:
                self.stats["open"] -= 1
                raise
        self.stats["in_flight"] += 1
        self.stats["peak_in_flight"] = max(self.stats["peak_in_flight"], self.stats["in_flight"])
        try:
            # A server prefills a prompt (in its slot, if it has slots) before it writes
            # the answer: the prefill and its wait for the prefill lane come first, then
            # the latency.
            pause = self.delay()
            if self.queue is not None:
                async with self.queue.slot():
                    cached = await self.prefill(body["messages"], prompt_tokens)
                    if prefilled is not None:
                        await prefilled()
                    await asyncio.sleep(pause)
            else:
                cached = await self.prefill(body["messages"], prompt_tokens)
                if prefilled is not None:
                    await prefilled()
                if pause:
                    await asyncio.sleep(pause)
        finally:
            self.stats["in_flight"] -= 1
            self.stats["open"] -= 1
            if self.slots is not None:
                self.slots.release()
        answer = orjson.dumps(ANSWERS[kind](doc)).decode()
        completion_tokens = len(answer) // 4
        self.stats["prompt_tokens"] += prompt_tokens
        self.stats["completion_tokens"] += completion_tokens
        return (
            200,
            orjson.dumps(
                {
                    "id": f"sim-{self.stats['requests']}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "sim"),
                    "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer}}
                    ],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                        "prompt_tokens_details": {"cached_tokens": cached},
                    },
                }
            ),
            quota,
        )

    async def prefill(self, messages: list[dict[str, Any]], prompt_tokens: int) -> int:
        """The prompt's prefill on this replica; its cached tokens (0 without a prefix cache)."""
        return await self.prefix.prefill(messages, prompt_tokens) if self.prefix is not None else 0

    def garbage(self, body: dict[str, Any]) -> bytes:
        """An answer no judgment can be read from; the three shapes in turn."""
        shape = self.stats["garbage"] % 3
        if shape == 0:
            return b"<html><body>502 upstream hiccup</body></html>"
        content = "I am not sure; the page seems relevant." if shape == 1 else '{"verdict": "maybe", "level": "high"}'
        return orjson.dumps(
            {
                "id": f"sim-garbage-{self.stats['garbage']}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "sim"),
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
            }
        )

    def reset(self) -> None:
        for key in (
            "requests",
            "visit",
            "snippet",
            "rubric",
            "citation",
            "errors",
            "prompt_tokens",
            "completion_tokens",
            "peak_in_flight",
            "peak_open",
            "rate_limited",
            "garbage",
        ):
            self.stats[key] = 0
        if self.prefix is not None:
            self.prefix.reset()
        if self.queue is not None:
            self.queue.reset()


SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def sse_first() -> bytes:
    return b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'


def sse_rest(payload: bytes) -> bytes:
    """The rest of a streamed answer: its content, its finish, its usage, the end."""
    body = orjson.loads(payload)
    choice = body["choices"][0]
    base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}
    events = [
        base | {"choices": [{"index": 0, "delta": {"content": choice["message"]["content"]}}]},
        base | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
        base | {"choices": [], "usage": body["usage"]},
    ]
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def app(sim: Simulator, keepalive: bool = True) -> Any:
    """A bare ASGI app: the simulator's own CPU competes with the platform for this
    machine's two cores, so it skips a framework's request and response objects.
    Without ``keepalive`` every answer closes its connection (``Connection: close``)."""
    closing = [] if keepalive else [(b"connection", b"close")]

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        extra: list[tuple[bytes, bytes]] = []
        raw = b"".join(chunks)
        streamed = path == "/v1/chat/completions" and method == "POST" and b'"stream":true' in raw
        started = [False]

        async def first_token() -> None:
            # The response and its first event go out once the prompt is prefilled, as a
            # streaming server sends its first token.
            started[0] = True
            await send({"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *closing]})
            await send({"type": "http.response.body", "body": sse_first(), "more_body": True})

        prefilled = first_token if streamed else None
        if path == "/v1/chat/completions" and method == "POST" and sim.queue is not None:
            gone, watcher = watch_disconnect(receive)
            status, payload, extra = await sim.completion(raw, prefilled)
            watcher.cancel()
            if status == 200:
                sim.queue.finished(gone)
        elif path == "/v1/chat/completions" and method == "POST":
            status, payload, extra = await sim.completion(raw, prefilled)
        elif path == "/stats":
            status, payload = (
                200,
                orjson.dumps(
                    {
                        **sim.stats,
                        **(sim.prefix.stats if sim.prefix else {}),
                        **({"lane_intervals": sim.prefix.intervals} if sim.prefix else {}),
                        **(sim.queue.stats if sim.queue else {}),
                    }
                ),
            )
        elif path == "/garbage" and method == "POST":
            seconds = float(parse_qs(scope["query_string"].decode()).get("seconds", ["0"])[0])
            sim.garbage_until = time.monotonic() + seconds
            status, payload = 200, orjson.dumps({"garbage_for_s": seconds})
        elif path == "/reset" and method == "POST":
            sim.reset()
            status, payload = 200, orjson.dumps(sim.stats)
        else:
            status, payload = 404, b'{"error": {"message": "not found"}}'
        if started[0]:
            await send({"type": "http.response.body", "body": sse_rest(payload)})
            return
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    *extra,
                    *closing,
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    return asgi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--latency", type=float, default=1.0, help="fixed (or median, with --lognormal-sigma) seconds")
    parser.add_argument("--lognormal-sigma", type=float, default=0.0)
    parser.add_argument("--concurrency", type=int, default=0, help="requests served at once (0: unlimited)")
    parser.add_argument("--slots", type=int, default=0, help="a server that queues: slots, FIFO inside (0: none)")
    parser.add_argument("--error-rate", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--backlog", type=int, default=4096, help="the listen queue (a small server: 5)")
    parser.add_argument("--no-keepalive", action="store_true", help="close every connection after its answer")
    parser.add_argument("--rate", type=float, default=0.0, help="requests a second allowed (0: no quota)")
    parser.add_argument("--burst", type=float, default=0.0, help="the quota's bucket (default: one second of it)")
    parser.add_argument("--rate-headers", action="store_true", help="answers carry x-ratelimit-* headers")
    prefix_cache.add_arguments(parser)
    args = parser.parse_args()
    quota = Quota(args.rate, args.burst or args.rate, args.rate_headers) if args.rate > 0 else None
    queue = QueueingServer(args.slots) if args.slots > 0 else None
    sim = Simulator(
        args.latency,
        args.lognormal_sigma,
        args.concurrency,
        args.error_rate,
        args.seed,
        quota,
        prefix_cache.from_args(args),
        queue,
    )
    uvicorn.run(
        app(sim, keepalive=not args.no_keepalive),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        backlog=args.backlog,
        limit_concurrency=None,
        access_log=False,
        # HTTP/1.0-style service: h11 honours Connection: close from the app.
        http="h11" if args.no_keepalive else "auto",
    )


if __name__ == "__main__":
    main()
