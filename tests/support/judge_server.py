"""An OpenAI-compatible chat-completions server for tests, run on 127.0.0.1 in a thread.

Each request is answered by a script: a function of the parsed call (its kind, the JSON
document the judge was given, the request number) returning a :class:`Reply`. The
server records every request, so tests can count calls and inspect what was sent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tests.support.live import LiveServer, free_port


@dataclass
class Call:
    number: int
    kind: str  # visit | snippet
    document: dict[str, Any]
    request: dict[str, Any]
    received_at: float = 0.0
    #: The client's source port: calls on one keep-alive connection share it.
    client_port: int = 0


@dataclass
class Reply:
    content: str | None = None
    status: int = 200
    delay: float = 0.0
    finish_reason: str = "stop"
    error: str = "scripted failure"
    #: The answer's ``usage`` as given (e.g. with ``prompt_tokens_details.cached_tokens``);
    #: None: prompt characters // 4 and answer characters // 4.
    usage: dict[str, Any] | None = None
    #: Streamed (a server with ``streams``, a request asking ``stream``): seconds before
    #: the first event (the prefill; ``delay`` follows it), an error event sent after
    #: it, or the connection dropped after it.
    prefill: float = 0.0
    stream_error: str | None = None
    stream_cut: bool = False

    @staticmethod
    def json(value: Any, **kw: Any) -> Reply:
        return Reply(content=json.dumps(value), **kw)


Script = Callable[[Call], Reply]


@dataclass
class RateLimit:
    """A hosted judge's quota: a token bucket of ``per_s`` requests a second holding up
    to ``burst``; past it a 429 with ``retry-after`` (and ``retry-after-ms``). With
    ``headers`` every answer carries OpenAI's ``x-ratelimit-*-requests`` headers."""

    per_s: float
    burst: float
    headers: bool = True
    tokens: float = 0.0
    at: float = 0.0

    def take(self) -> tuple[bool, dict[str, str]]:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_s) if self.at else self.burst
        self.at = now
        allowed = self.tokens >= 1
        if allowed:
            self.tokens -= 1
        headers: dict[str, str] = {}
        if self.headers:
            headers = {
                "x-ratelimit-limit-requests": str(int(self.per_s * 60)),
                "x-ratelimit-remaining-requests": str(int(self.tokens)),
                "x-ratelimit-reset-requests": f"{(self.burst - self.tokens) / self.per_s:.3f}s",
            }
        if not allowed:
            wait = (1 - self.tokens) / self.per_s
            headers["retry-after-ms"] = str(max(1, round(wait * 1000)))
            headers["retry-after"] = str(max(1, math.ceil(wait)))
        return allowed, headers


@dataclass
class JudgeServer:
    script: Script
    calls: list[Call] = field(default_factory=list)
    port: int = 0
    reject_response_format: bool = False
    in_flight: int = 0
    peak_in_flight: int = 0
    live: LiveServer | None = None
    #: A request quota (429 beyond it), and how many requests it turned away.
    rate: RateLimit | None = None
    rate_limited: int = 0
    #: Answer with ``Connection: close`` (a server without keep-alive).
    close_connections: bool = False
    #: Append each served call to this file as a JSON line (a server in another process).
    calls_log: Path | None = None
    #: A server that queues (vLLM, SGLang): this many calls served at once, the others
    #: waiting inside in arrival order (0: all at once); the most that waited.
    slots: int = 0
    peak_queued: int = 0
    _gate: asyncio.Semaphore | None = None
    #: Answer a request that asks ``stream`` with server-sent events (else one body).
    streams: bool = False

    def down(self) -> None:
        """Stop serving: every connection is refused until :meth:`up`."""
        assert self.live is not None
        self.live.stop()

    def up(self) -> None:
        assert self.live is not None
        self.live.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def count(self, kind: str | None = None) -> int:
        return sum(1 for c in self.calls if kind is None or c.kind == kind)


def _kind(document: dict[str, Any]) -> str:
    if "visit" in document:
        return "visit"
    if "report" in document:
        return "rubric"
    if "claim" in document:
        return "citation"
    return "snippet"


def _app(server: JudgeServer) -> Starlette:
    lock = threading.Lock()

    extra = {"connection": "close"} if server.close_connections else {}

    async def completions(request: Request) -> JSONResponse | StreamingResponse:
        body = await request.json()
        quota: dict[str, str] = {}
        if server.rate is not None:
            allowed, quota = server.rate.take()
            if not allowed:
                server.rate_limited += 1
                return JSONResponse(
                    {"error": {"message": "rate limit reached", "type": "requests"}},
                    status_code=429,
                    headers={**quota, **extra},
                )
        if server.reject_response_format and "response_format" in body:
            return JSONResponse(
                {"error": {"message": "response_format is not supported", "type": "invalid_request_error"}},
                status_code=400,
            )
        # The prompt's document is its first user message; a retry after a rejected
        # answer adds that answer and a note after it.
        document = json.loads(next(m["content"] for m in body["messages"] if m["role"] == "user"))
        with lock:
            port = request.client.port if request.client else 0
            call = Call(len(server.calls) + 1, _kind(document), document, body, time.monotonic(), port)
            server.calls.append(call)
            if server.calls_log is not None:
                with server.calls_log.open("a") as log:
                    log.write(json.dumps({"key": call_key(call), "at": time.time()}) + "\n")
        reply = server.script(call)
        if server.streams and body.get("stream") and reply.status == 200:
            return StreamingResponse(_events(body, call, reply), media_type="text/event-stream", headers=extra)
        if server.slots:
            gate = server._gate = server._gate or asyncio.Semaphore(server.slots)
            server.peak_queued = max(server.peak_queued, server.in_flight + 1 - server.slots)
        server.in_flight += 1
        server.peak_in_flight = max(server.peak_in_flight, server.in_flight)
        try:
            if server.slots:
                async with gate:
                    await asyncio.sleep(reply.delay)
            elif reply.delay:
                await asyncio.sleep(reply.delay)
        finally:
            server.in_flight -= 1
        if reply.status != 200:
            return JSONResponse(
                {"error": {"message": reply.error, "type": "server_error"}},
                status_code=reply.status,
                headers={**quota, **extra},
            )
        content = reply.content or ""
        prompt_chars = sum(len(m["content"]) for m in body["messages"])
        return JSONResponse(
            {
                "id": f"chatcmpl-{call.number}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "scripted"),
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": reply.finish_reason,
                        "message": {"role": "assistant", "content": content},
                    }
                ],
                "usage": reply.usage
                if reply.usage is not None
                else {
                    "prompt_tokens": prompt_chars // 4,
                    "completion_tokens": len(content) // 4,
                    "total_tokens": prompt_chars // 4 + len(content) // 4,
                },
            },
            headers={**quota, **extra},
        )

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


async def _events(body: dict[str, Any], call: Call, reply: Reply) -> AsyncIterator[bytes]:
    """A streamed answer as servers send one: a first event once the prompt is prefilled,
    the content, the finish, the usage (asked with ``stream_options``), the end."""
    base = {"id": f"chatcmpl-{call.number}", "object": "chat.completion.chunk", "model": body.get("model", "scripted")}

    def event(**fields: Any) -> bytes:
        return b"data: " + json.dumps(base | fields).encode() + b"\n\n"

    await asyncio.sleep(reply.prefill)
    yield event(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}])
    if reply.stream_cut:
        raise ConnectionResetError("the stream was cut off")  # the server aborts the response
    await asyncio.sleep(reply.delay)
    if reply.stream_error is not None:
        yield b"data: " + json.dumps({"error": {"message": reply.stream_error}}).encode() + b"\n\n"
        return
    content = reply.content or ""
    yield event(choices=[{"index": 0, "delta": {"content": content}}])
    yield event(choices=[{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}])
    if (body.get("stream_options") or {}).get("include_usage"):
        prompt_chars = sum(len(m["content"]) for m in body["messages"])
        usage = reply.usage or {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(content) // 4}
        yield event(choices=[], usage=usage)
    yield b"data: [DONE]\n\n"


def call_key(call: Call) -> str:
    """What identifies a request: its kind and the document the judge was given."""
    return call.kind + json.dumps(call.document, sort_keys=True)


@contextmanager
def running_judge(
    script: Script,
    *,
    reject_response_format: bool = False,
    rate: RateLimit | None = None,
    close_connections: bool = False,
    backlog: int = 2048,
    slots: int = 0,
    streams: bool = False,
) -> Iterator[JudgeServer]:
    """A judge server for the block; ``server.down()`` and ``server.up()`` stop it (connections
    refused) and start it again on the same port. ``backlog``: the listen queue (a small
    server accepts few connections at once); ``slots``: a server that queues the rest."""
    server = JudgeServer(
        script,
        port=free_port(),
        reject_response_format=reject_response_format,
        rate=rate,
        close_connections=close_connections,
        slots=slots,
        streams=streams,
    )
    live = LiveServer(_app(server), lifespan="off", port=server.port, backlog=backlog)
    server.live = live
    live.start()
    try:
        yield server
    finally:
        live.stop()


# ----------------------------------------------------------------------------- the marker script

_MARK = re.compile(r"\[(?P<rubric>[A-Za-z0-9_-]+):(?P<level>[012]):(?P<point>[^\]]+)\]")
_SNIP = re.compile(r"\[(?P<rubric>[A-Za-z0-9_-]+)\]")


def marker_answer(call: Call) -> dict[str, Any]:
    """Answer from markers in the page/snippet text, deterministically.

    Visit: evidence marker ``[R1:2:fact-a]`` means level 2 for rubric R1 with support
    point ``fact-a``, unless ``fact-a`` is already in the prior support (then level 0):
    a judge that is history-aware in the simplest possible way. The highest new level
    over the pages wins. Snippet: ``[R1]`` in a snippet is a match for R1 quoting it.
    """
    doc = call.document
    if call.kind == "visit":
        rubric = doc["rubric_item"]["id"]
        prior = set(doc["support_already_credited"])
        best, pages, points = 0, [], []
        for page in doc["visit"]["pages"]:
            for mark in _MARK.finditer(page["evidence"]):
                if mark["rubric"] != rubric or mark["point"] in prior or mark["point"] in points:
                    continue
                level = int(mark["level"])
                if level == 0:
                    continue
                best = max(best, level)
                pages.append(page["id"])
                points.append(mark["point"])
        if best == 0:
            return {"level": 0, "page_ids": [], "support_points": [], "rationale": "nothing new"}
        return {
            "level": best,
            "page_ids": list(dict.fromkeys(pages)),
            "support_points": points[:3],
            "rationale": "marker",
        }
    if call.kind == "rubric":
        # "[R1=3]" in the report: rubric R1 scores 3; unmarked rubrics score 0.
        mark = re.search(r"\[" + re.escape(doc["rubric_item"]["id"]) + r"=([0-4])\]", doc["report"])
        return {"score": int(mark.group(1)) if mark else 0, "rationale": "marker"}
    if call.kind == "citation":
        # "[support=2]" in a page's evidence: that page supports claims at 2; the joint
        # call takes the best page.
        scores = [int(m) for p in doc["cited_pages"] for m in re.findall(r"\[support=([0-2])\]", p["evidence"])]
        return {"score": max(scores, default=0), "rationale": "marker"}
    matches = []
    for result in doc["unopened_results"]:
        for mark in _SNIP.finditer(result["snippet"]):
            matches.append({"rubric_id": mark["rubric"], "result_id": result["id"], "evidence_quote": mark.group(0)})
    return {"matches": matches}


def marker_script(call: Call) -> Reply:
    return Reply.json(marker_answer(call))


# ----------------------------------------------------------------------------- in a process of its own


@dataclass
class JudgeProcess:
    """The marker judge in a subprocess (see :func:`serve_marker_judge`)."""

    port: int
    calls_log: Path
    process: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def calls(self) -> list[str]:
        """The request keys (:func:`call_key`) it served, in order."""
        if not self.calls_log.exists():
            return []
        return [json.loads(line)["key"] for line in self.calls_log.read_text().splitlines() if line.strip()]

    def kill(self) -> None:
        """SIGKILL: its calls in flight are cut off, its port refuses connections."""
        self.process.kill()
        self.process.wait(10)


@contextmanager
def judge_process(workdir: Path, delay: float = 0.0, port: int | None = None) -> Iterator[JudgeProcess]:
    """``port``: a port of its own (a replica started again where a killed one served)."""
    import subprocess
    import sys

    import httpx

    port = port or free_port()
    judge = JudgeProcess(port, workdir / f"judge-{port}-{time.monotonic_ns()}.calls.jsonl")
    argv = [sys.executable, "-m", "tests.support.judge_server", "--port", str(port), "--delay", str(delay)]
    judge.process = subprocess.Popen([*argv, "--calls-log", str(judge.calls_log)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or judge.process.poll() is not None:
                    raise RuntimeError("the judge process did not start") from None
                time.sleep(0.1)
        yield judge
    finally:
        if judge.process.poll() is None:
            judge.kill()


def serve_marker_judge() -> None:
    """``python -m tests.support.judge_server --port P --delay D --calls-log F``: the marker
    judge in a process of its own, so that a test can kill it (SIGKILL) mid-batch; every
    call it served is a line of ``--calls-log``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--calls-log", type=Path, required=True)
    args = parser.parse_args()

    def script(call: Call) -> Reply:
        return Reply.json(marker_answer(call), delay=args.delay)

    server = JudgeServer(script, port=args.port, calls_log=args.calls_log)
    import uvicorn

    uvicorn.run(_app(server), host="127.0.0.1", port=args.port, log_level="warning", lifespan="off")


if __name__ == "__main__":
    serve_marker_judge()
