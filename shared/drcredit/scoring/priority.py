"""Who goes first at the engine's judge slots: the step's longest chains.

A step ends when its longest chain of dependent judge calls does, so wherever chains
queue, the one with the most calls still to make should be served first (the rule
that keeps a schedule near its critical path). The slots are only used from the
engine loop; a slot's priority also orders the call's wait for a judge endpoint
(:data:`~drcredit.judges.fleet.router.CALL_PRIORITY`). The order in which units make
their first call is :mod:`drcredit.scoring.start_order`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager

from drcredit.judges.fleet.router import CALL_PRIORITY
from drcredit.tenancy.fair import FairQueue
from drcredit.tenancy.owner import CALL_OWNER, Owner

#: What goes with what: the calls of one visit of one rollout (its rubric chains' calls
#: share the visit's pages, a prefix the judge server caches); None: nothing.
Together = Hashable | None


class PrioritySlots:
    """A semaphore that hands a freed slot to the waiter that should go first.

    When more chains are ready than the judge takes at once, a plain (FIFO) semaphore
    sends a chain that has just been answered to the back of the queue for its next
    call, so a step's longest chains, which decide its wall time, wait once per call.
    Priority is the caller's remaining work (a chain's calls still to make, and a snippet
    call waiting on its visits: ``calls_on_path``): the longest
    remaining path goes first, the rule that keeps a schedule near its critical path.
    Equal priorities are served in arrival order, except that when a call is handed a
    slot, the waiting calls that go ``together`` with it (the other rubrics' calls for
    the same visit, which share its prompt prefix) move ahead of the others of its
    priority, so they reach the judge beside it. Across tenants the slots are shared as
    the judge fleet is (:class:`~drcredit.tenancy.fair.FairQueue`: tenants by ``weight``,
    training before audits, runs in turn, then priority): a tenant-blind gate here would
    fill the fleet's queue with the calls of whoever is served slowest, and the fleet
    could not give the others their share. Only used from the engine loop.
    """

    def __init__(self, slots: int, weight: Callable[[str], float] | None = None):
        self._free = slots
        #: A tenant's weight now (the judge fleet's part of it in this process).
        self.weight: Callable[[str], float] = weight or (lambda _tenant: 1.0)
        self._waiters: FairQueue[asyncio.Future[None]] = FairQueue(lambda tenant: self.weight(tenant))
        #: Waiters that go with others: (owner, priority, together), and the reverse.
        self._with: dict[asyncio.Future[None], tuple[Owner, int, Hashable]] = {}
        self._siblings: dict[Hashable, set[asyncio.Future[None]]] = {}

    async def acquire(self, priority: int, together: Together = None) -> None:
        # The judge fleet orders the calls waiting for an endpoint by the same priority.
        CALL_PRIORITY.set(priority)
        # A free slot means nobody waits: a release hands its slot to a live waiter.
        if self._free > 0:
            self._free -= 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        owner = CALL_OWNER.get()
        self._waiters.push(granted, owner, priority)
        if together is not None:
            self._with[granted] = (owner, priority, together)
            self._siblings.setdefault(together, set()).add(granted)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release()  # handed a slot just as it was cancelled: pass it on
            raise

    def release(self) -> None:
        while True:
            waiter = self._waiters.first()
            if waiter is None:
                self._free += 1
                return
            if waiter.done():  # cancelled while it waited: takes nobody's turn
                self._waiters.pop_first(charge=False)
                self._forget(waiter)
                continue
            self._waiters.pop_first()
            waiter.set_result(None)  # the slot passes straight to a waiter
            went = self._forget(waiter)
            if went is not None:  # its siblings next, ahead of the others of its priority
                owner, priority, together = went
                self._waiters.promote(owner, priority, self._siblings.get(together, set()))
            return

    def _forget(self, waiter: asyncio.Future[None]) -> tuple[Owner, int, Hashable] | None:
        went = self._with.pop(waiter, None)
        if went is not None:
            siblings = self._siblings[went[2]]
            siblings.discard(waiter)
            if not siblings:
                del self._siblings[went[2]]
        return went

    @asynccontextmanager
    async def slot(self, priority: int = 0, together: Together = None) -> AsyncIterator[None]:
        await self.acquire(priority, together)
        try:
            yield
        finally:
            self.release()
