"""Who goes first on a process's event loop: the step's longest chains.

A step ends when its longest chain of dependent judge calls does, so wherever chains
queue, the one with the most calls still to make should be served first (the rule
that keeps a schedule near its critical path). Both primitives here are only used
from the engine loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class _Waiters:
    """Waiters granted highest priority first, then in arrival order; a cancelled
    waiter is skipped, never granted."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    def __bool__(self) -> bool:
        return bool(self._heap)

    def add(self, priority: int) -> asyncio.Future[None]:
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (-priority, next(self._arrivals), granted))
        return granted

    def grant_next(self) -> bool:
        """Grant the first live waiter; False when none is left."""
        while self._heap:
            _, _, granted = heapq.heappop(self._heap)
            if not granted.done():
                granted.set_result(None)
                return True
        return False


class PrioritySlots:
    """A semaphore that hands a freed slot to the waiter with the highest priority.

    When more chains are ready than the judge takes at once, a plain (FIFO) semaphore
    sends a chain that has just been answered to the back of the queue for its next
    call, so a step's longest chains, which decide its wall time, wait once per call.
    Priority is the caller's remaining work (a chain's calls still to make): the longest
    remaining path goes first, the rule that keeps a schedule near its critical path.
    Equal priorities are served in arrival order. Only used from the engine loop.
    """

    def __init__(self, slots: int):
        self._free = slots
        self._waiters = _Waiters()

    async def acquire(self, priority: int) -> None:
        # A free slot means nobody waits: a release hands its slot to a live waiter.
        if self._free > 0:
            self._free -= 1
            return
        granted = self._waiters.add(priority)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release()  # handed a slot just as it was cancelled: pass it on
            raise

    def release(self) -> None:
        if not self._waiters.grant_next():  # the slot passes straight to a waiter
            self._free += 1

    @asynccontextmanager
    async def slot(self, priority: int = 0) -> AsyncIterator[None]:
        await self.acquire(priority)
        try:
            yield
        finally:
            self.release()


class StartOrder:
    """Admits units to their first call, deepest first, a few per loop iteration.

    A visit chain waits with its number of calls; a snippet or outcome call, which no
    other call waits on, with 1.

    A step's first wave is every chain of every group starting at once: on a busy
    loop, callbacks run in arrival order, so a long chain of a group stored a moment
    later waited behind the first calls of hundreds of short chains, and its first
    answer behind their sends (0.4-1.1 s of an 11 s step, BENCHMARKS.md, sixth round).
    Waiting units are admitted ``per_tick`` at a time, once per iteration of the
    loop (a call scheduled with ``call_soon`` runs after what is already queued), so
    a long chain that arrives late passes the short ones still waiting, and answers
    arriving meanwhile are handled between admissions. On an idle loop an admission
    costs one iteration.
    """

    def __init__(self, per_tick: int = 64):
        if per_tick < 1:
            raise ValueError("per_tick must be at least 1")
        self.per_tick = per_tick
        self._waiters = _Waiters()
        self._scheduled = False

    async def wait(self, priority: int) -> None:
        """Return when admitted (``priority``: the unit's calls to make; more goes first)."""
        loop = asyncio.get_running_loop()
        granted = self._waiters.add(priority)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._admit, loop)
        await granted

    def _admit(self, loop: asyncio.AbstractEventLoop) -> None:
        admitted = 0
        while admitted < self.per_tick and self._waiters.grant_next():
            admitted += 1
        if self._waiters:
            loop.call_soon(self._admit, loop)
        else:
            self._scheduled = False
