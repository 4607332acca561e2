"""A judge server that queues, as vLLM, SGLang and TGI do: a fixed number of slots.

Every request is accepted; ``slots`` of them are worked on at once and the others wait
inside, first come first served. Nothing (no ``/props``, no header) says how many slots
there are. A client that gives up (its timeout) does not stop the work: the answer is
still computed and counted as *abandoned* (a hosted judge bills it). The simulator
(:mod:`bench.judge_sim`, ``--slots N``) holds a slot around each answer's latency and
reports these counts in ``/stats``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]


class QueueingServer:
    """``slots`` places taken in arrival order; the rest wait (engine loop only)."""

    def __init__(self, slots: int):
        if slots < 1:
            raise ValueError(f"slots must be at least 1 (got {slots})")
        self.slots = slots
        self.busy = 0
        self._queue: deque[asyncio.Future[None]] = deque()
        self.stats: dict[str, int] = {"queued": 0, "peak_queued": 0, "abandoned": 0, "answered": 0}

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold a slot for the body (waiting in line for one first)."""
        if self.busy < self.slots and not self._queue:
            self.busy += 1
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._queue.append(turn)
            self.stats["queued"] += 1
            self.stats["peak_queued"] = max(self.stats["peak_queued"], len(self._queue))
            try:
                await turn  # the slot is handed over by the call that frees it (busy unchanged)
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._hand_over()  # handed over just as it was cancelled: pass it on
                raise
        try:
            yield
        finally:
            self._hand_over()

    def _hand_over(self) -> None:
        while self._queue:
            turn = self._queue.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.busy -= 1

    def finished(self, client_gone: asyncio.Event) -> None:
        """An answer is ready: abandoned when its client left while it waited or ran."""
        self.stats["abandoned" if client_gone.is_set() else "answered"] += 1

    def reset(self) -> None:
        for key in ("queued", "peak_queued", "abandoned", "answered"):
            self.stats[key] = 0


def watch_disconnect(receive: Receive) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """An event set when the client disconnects (ASGI ``http.disconnect``), and the task
    watching for it (cancel it once the answer is sent)."""
    gone = asyncio.Event()

    async def watch() -> None:
        while True:
            message = await receive()
            if message.get("type") == "http.disconnect":
                gone.set()
                return

    return gone, asyncio.get_running_loop().create_task(watch())
