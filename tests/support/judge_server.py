"""An OpenAI-compatible chat-completions server for tests, run on 127.0.0.1 in a thread.

Each request is answered by a script: a function of the parsed call (its kind, the JSON
document the judge was given, the request number) returning a :class:`Reply`. The
server records every request, so tests can count calls and inspect what was sent.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
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

    @staticmethod
    def json(value: Any, **kw: Any) -> Reply:
        return Reply(content=json.dumps(value), **kw)


Script = Callable[[Call], Reply]


@dataclass
class JudgeServer:
    script: Script
    calls: list[Call] = field(default_factory=list)
    port: int = 0
    reject_response_format: bool = False
    in_flight: int = 0
    peak_in_flight: int = 0
    live: LiveServer | None = None

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

    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        if server.reject_response_format and "response_format" in body:
            return JSONResponse(
                {"error": {"message": "response_format is not supported", "type": "invalid_request_error"}},
                status_code=400,
            )
        document = json.loads(body["messages"][-1]["content"])
        with lock:
            port = request.client.port if request.client else 0
            call = Call(len(server.calls) + 1, _kind(document), document, body, time.monotonic(), port)
            server.calls.append(call)
        reply = server.script(call)
        server.in_flight += 1
        server.peak_in_flight = max(server.peak_in_flight, server.in_flight)
        try:
            if reply.delay:
                await asyncio.sleep(reply.delay)
        finally:
            server.in_flight -= 1
        if reply.status != 200:
            return JSONResponse({"error": {"message": reply.error, "type": "server_error"}}, status_code=reply.status)
        content = reply.content or ""
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
                "usage": {
                    "prompt_tokens": len(body["messages"][-1]["content"]) // 4,
                    "completion_tokens": len(content) // 4,
                    "total_tokens": len(body["messages"][-1]["content"]) // 4 + len(content) // 4,
                },
            }
        )

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])


@contextmanager
def running_judge(script: Script, *, reject_response_format: bool = False) -> Iterator[JudgeServer]:
    """A judge server for the block; ``server.down()`` and ``server.up()`` stop it (connections
    refused) and start it again on the same port."""
    server = JudgeServer(script, port=free_port(), reject_response_format=reject_response_format)
    live = LiveServer(_app(server), lifespan="off", port=server.port)
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
