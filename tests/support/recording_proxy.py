"""A pass-through HTTP proxy that records what the platform sent a real judge server.

A real server cannot be scripted, but what it was asked can be checked: every request
is forwarded unchanged and recorded with its body, the answer (a streamed one added up
to the body a plain answer has, marked ``streamed``), when it arrived and when it was
answered, and how many chat completions were at the server at once. The proxy passes an
answer on whole, as a buffering proxy does: the platform reads its first event with its
last.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from drcredit.judges.openai_wire import NoAnswer, StreamedBody
from tests.support.live import LiveServer


@dataclass
class Exchange:
    path: str
    request: Any
    status: int = 0
    response: Any = None
    received_at: float = 0.0
    answered_at: float = 0.0

    @property
    def seconds(self) -> float:
        return self.answered_at - self.received_at


@dataclass
class RecordingProxy:
    target: str
    port: int = 0
    exchanges: list[Exchange] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0
    #: Paths answered 404 here instead of forwarded (a server without them).
    refuse: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def chats(self) -> list[Exchange]:
        return [x for x in self.exchanges if x.path.endswith("/chat/completions")]


def _app(proxy: RecordingProxy) -> Starlette:
    client = httpx.AsyncClient(base_url=proxy.target, timeout=600)

    async def forward(request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        chat = path.endswith("/chat/completions")
        exchange = Exchange(path, orjson.loads(body) if body else None, received_at=time.monotonic())
        proxy.exchanges.append(exchange)
        if any(path.endswith(suffix) for suffix in proxy.refuse):
            exchange.status, exchange.answered_at = 404, time.monotonic()
            return Response(b'{"error": {"message": "not found"}}', 404, media_type="application/json")
        if chat:
            proxy.in_flight += 1
            proxy.peak_in_flight = max(proxy.peak_in_flight, proxy.in_flight)
        try:
            answer = await client.request(
                request.method, path, content=body, headers={"content-type": "application/json"}
            )
        finally:
            if chat:
                proxy.in_flight -= 1
        exchange.answered_at = time.monotonic()
        exchange.status = answer.status_code
        if answer.headers.get("content-type", "").startswith("text/event-stream"):
            try:
                exchange.response = _assembled(answer.text)  # a streamed answer, read as one
            except NoAnswer:  # an error event: kept as the server sent it
                exchange.response = answer.text
        else:
            try:
                exchange.response = answer.json()
            except ValueError:
                exchange.response = answer.text
        return Response(answer.content, answer.status_code, media_type=answer.headers.get("content-type"))

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])


def _assembled(text: str) -> dict[str, Any]:
    """A streamed chat completion's events as the body a plain answer has, read the way
    the platform reads them (:class:`~drcredit.judges.openai_wire.StreamedBody`)."""
    body = StreamedBody()
    for line in text.splitlines():
        data = line[5:].strip() if line.startswith("data:") else ""
        if data == "[DONE]":
            break
        if data:
            body.add(orjson.loads(data))
    return {**body.body(), "streamed": True}


@contextmanager
def recording_proxy(target: str, refuse: tuple[str, ...] = ()) -> Iterator[RecordingProxy]:
    """A proxy to ``target`` (a server root, http://127.0.0.1:PORT) for the block;
    requests to paths ending in one of ``refuse`` are answered 404."""
    proxy = RecordingProxy(target, refuse=refuse)
    live = LiveServer(_app(proxy), lifespan="off")
    proxy.port = live.port
    live.start()
    try:
        yield proxy
    finally:
        live.stop()
