"""A judge server that queues, as vLLM, SGLang and TGI do, run as a process of its own.

It accepts every chat completion; ``--slots`` of them are served at once (each takes
``--service`` seconds) and the others wait inside, first come first served. Nothing says
how many slots it has (``/props`` and ``/v1/models`` are 404). A client that gave up
does not stop the work: such answers are counted as abandoned. ``GET /stats`` gives the
counts (``POST /reset``: from zero); ``POST /slots?n=N`` changes the slots (a server
restarted with another ``--max-num-seqs``, without restarting it), ``POST /service?s=X``
each call's time (other clients, longer prompts).

    python -m tests.support.queueing_judge --port P --slots 4 --service 0.25
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import httpx
import uvicorn

from tests.support.live import free_port

#: The answer to every call: a valid visit judgment.
ANSWER = {"level": 2, "page_ids": ["W1"], "support_points": ["the plant opened in 2019"], "rationale": "direct"}


class Slots:
    """``n`` places taken in arrival order (engine loop only)."""

    def __init__(self, n: int):
        self.n, self.busy = n, 0
        self.line: deque[asyncio.Future[None]] = deque()
        self.stats = {"requests": 0, "answered": 0, "abandoned": 0, "peak_in_service": 0, "peak_queued": 0}

    async def take(self) -> None:
        if self.busy < self.n and not self.line:
            self.busy += 1
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.line.append(turn)
            self.stats["peak_queued"] = max(self.stats["peak_queued"], len(self.line))
            await turn
        self.stats["peak_in_service"] = max(self.stats["peak_in_service"], self.busy)

    def give(self) -> None:
        self.busy -= 1
        self.admit()

    def admit(self) -> None:
        """Hand free slots to the calls in line (after a release, or more slots)."""
        while self.line and self.busy < self.n:
            turn = self.line.popleft()
            if not turn.done():
                self.busy += 1
                turn.set_result(None)


def app(slots: Slots, service_s: float) -> Any:
    #: Seconds a call takes in its slot (``POST /service?s=X``: a server slowed by other
    #: clients or longer prompts, or sped up).
    pace = {"service_s": service_s}

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = bool(message.get("more_body"))
        path, status, body = scope["path"], 404, b'{"error": {"message": "not found"}}'
        query = dict(parse_qsl(scope["query_string"].decode()))
        if path.endswith("/chat/completions"):
            gone = asyncio.Event()

            async def watch() -> None:
                while (await receive()).get("type") != "http.disconnect":
                    pass
                gone.set()

            watcher = asyncio.get_running_loop().create_task(watch())
            slots.stats["requests"] += 1
            await slots.take()
            try:
                await asyncio.sleep(pace["service_s"])
            finally:
                slots.give()
            watcher.cancel()
            slots.stats["abandoned" if gone.is_set() else "answered"] += 1
            status, body = 200, _completion()
        elif path == "/stats":
            status, body = 200, json.dumps(slots.stats).encode()
        elif path == "/reset":
            slots.stats.update({k: 0 for k in slots.stats})
            status, body = 200, b"{}"
        elif path == "/slots":
            slots.n = int(query["n"])
            slots.admit()
            status, body = 200, json.dumps({"slots": slots.n}).encode()
        elif path == "/service":
            pace["service_s"] = float(query["s"])
            status, body = 200, json.dumps(pace).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return asgi


def _completion() -> bytes:
    content = json.dumps(ANSWER)
    return json.dumps(
        {
            "id": "q",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "judge-test",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
        }
    ).encode()


@dataclass
class QueueingJudge:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.root + "/v1"

    def stats(self) -> dict[str, int]:
        result: dict[str, int] = httpx.get(self.root + "/stats", timeout=5).json()
        return result

    def reset(self) -> dict[str, int]:
        """The counts so far, then zero."""
        counts = self.stats()
        httpx.post(self.root + "/reset", timeout=5).raise_for_status()
        return counts

    def set_slots(self, n: int) -> None:
        httpx.post(self.root + f"/slots?n={n}", timeout=5).raise_for_status()

    def set_service(self, seconds: float) -> None:
        httpx.post(self.root + f"/service?s={seconds}", timeout=5).raise_for_status()


@contextmanager
def queueing_judge(slots: int, service_s: float) -> Iterator[QueueingJudge]:
    """The server in a process of its own until the block ends."""
    port = free_port()
    argv = [sys.executable, "-m", "tests.support.queueing_judge", "--port", str(port)]
    process = subprocess.Popen([*argv, "--slots", str(slots), "--service", str(service_s)])
    judge = QueueingJudge(process, port)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                judge.stats()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the queueing judge did not start") from None
                time.sleep(0.1)
        yield judge
    finally:
        process.terminate()
        process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--service", type=float, required=True, help="seconds each call takes in its slot")
    args = parser.parse_args()
    uvicorn.run(app(Slots(args.slots), args.service), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
