"""Which units make their first judge call when: the deepest chains first, and the
first calls of units with slack to spare held back a little (:class:`StartOrder`).
Only used from the engine loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

from drcredit.scoring.priority import Together

#: A unit at least this many calls shorter than the deepest chain running holds its
#: first call back by one judge latency: it has more than two latencies of slack, and
#: keeps more than one after the hold for its own calls' stretch.
HOLD_MARGIN = 3

#: The longest hold, whatever the judge's latency.
MAX_HOLD_S = 10.0

#: Step of the sequence that spreads holds: successive values fill [0, 1) evenly.
GOLDEN_STEP = (math.sqrt(5) - 1) / 2

#: Weight of each answered call in the smoothed judge latency.
LATENCY_WEIGHT = 0.1


class _Waiters:
    """Waiters granted highest priority first, then in arrival order; a cancelled
    waiter is skipped, never granted. A waiter may name what it goes ``together``
    with: :meth:`promote` moves such siblings to the front of their priority."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, bool, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()
        #: Arrival numbers of promoted waiters: ahead of every plain arrival.
        self._ahead = itertools.count(-(2**62))
        self._together: dict[asyncio.Future[None], Hashable] = {}
        self._siblings: dict[Hashable, set[asyncio.Future[None]]] = {}

    def __bool__(self) -> bool:
        return bool(self._heap)

    def add(
        self,
        priority: int,
        granted: asyncio.Future[None] | None = None,
        held: bool = False,
        together: Together = None,
    ) -> asyncio.Future[None]:
        """Queue a waiter (``granted``: one coming back from a hold, with ``held`` set)."""
        if granted is None:
            granted = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (-priority, next(self._arrivals), held, granted))
        if together is not None:
            self._together[granted] = together
            self._siblings.setdefault(together, set()).add(granted)
        return granted

    def _forget(self, granted: asyncio.Future[None]) -> Together:
        together = self._together.pop(granted, None)
        if together is not None:
            _leave(self._siblings, together, granted)
        return together

    def pop(self) -> tuple[int, bool, asyncio.Future[None], Together] | None:
        """The first live waiter, taken off the queue: (priority, held before, its
        future, what it goes together with)."""
        while self._heap:
            priority, _, held, granted = heapq.heappop(self._heap)
            together = self._forget(granted)
            if not granted.done():
                return -priority, held, granted, together
        return None

    def siblings(self, together: Together) -> list[asyncio.Future[None]]:
        """The live waiters that go with ``together``."""
        if together is None:
            return []
        return [f for f in self._siblings.get(together, ()) if not f.done()]

    def promote(self, together: Together, priority: int) -> None:
        """Move the waiters that go with ``together`` and have ``priority`` ahead of the
        others of that priority (never ahead of a higher one: no longer chain waits)."""
        siblings = self._siblings.get(together) if together is not None else None
        if not siblings:
            return
        moved = sorted(
            (arrival, i)
            for i, (rank, arrival, _, granted) in enumerate(self._heap)
            if granted in siblings and rank == -priority and arrival >= 0
        )
        for _, i in moved:  # in their order of arrival
            rank, _, held, granted = self._heap[i]
            self._heap[i] = (rank, next(self._ahead), held, granted)
        if moved:
            heapq.heapify(self._heap)

    def grant_next(self) -> bool:
        """Grant the first live waiter, and move its waiting siblings up behind it;
        False when none is left."""
        waiter = self.pop()
        if waiter is None:
            return False
        priority, _, granted, together = waiter
        granted.set_result(None)
        self.promote(together, priority)
        return True


class StartOrder:
    """Admits units to their first call, deepest first, a few per loop iteration, and
    holds back the first call of units with slack to spare.

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

    Admission order alone does not keep the longest chain's first call clear of the
    wave: every first call opens a connection, and the judge server and this process
    work through the wave's connections in arrival order, so a chain's first request
    reached the judge a median 0.3 s (at most 0.85 s) after it was sent (BENCHMARKS.md,
    eighth round).
    So when its turn comes, a unit at least ``HOLD_MARGIN`` calls shorter than the
    deepest chain admitted here (its calls left estimated from the smoothed latency of
    answered calls) is held for one judge latency, then queues again and goes without
    another hold: its slack is at least that margin of latencies, and the deepest
    chains' first calls go out on a quieter machine. Until a call has been answered
    the latency is unknown (a fresh process's first step), so such a unit is held
    until the first judge call here ends instead, at most ``MAX_HOLD_S``: that first
    answer comes one latency after the first wave, which is the hold a known latency
    would have given.

    A unit that asks to be spread (``wait(..., spread=True)``) and has more slack than
    the margin is held longer, by a share of that extra slack that differs from one
    unit to the next (the golden-ratio sequence: any run of holds covers the range
    evenly). Outcome calls, one call each beside chains of up to 11, were all held for
    the same latency and went out in one wave, on the chains' own hops, whose answers
    waited behind them (BENCHMARKS.md, tenth round). Only they are spread: nothing
    but their group's aggregation waits on them, while a visit chain is followed by
    its snippet calls and its group may have been stored late, which the margin
    covers for one latency's hold but not for one that uses up the slack (spread
    chains of 6 calls ended a step 2 s after its bound). The first hold of a fresh
    process is not spread either: the first answers of a cold process come late, and
    a latency learnt from them spread units past the deepest chain.

    Units that go ``together`` (the rubric chains of one rollout whose next call is for
    the same visit: their prompts share its pages, which the judge server caches for a
    while) are let go at once: when one is admitted, its siblings waiting or held are
    admitted with it, and a sibling that comes later within one judge latency is not
    held. A unit is only ever let go earlier for a sibling, never held for one.
    """

    def __init__(self, per_tick: int = 64, clock: Callable[[], float] = time.monotonic):
        if per_tick < 1:
            raise ValueError("per_tick must be at least 1")
        self.per_tick = per_tick
        self._clock = clock
        self._waiters = _Waiters()
        self._scheduled = False
        #: Smoothed latency of answered judge calls (None until the first answer).
        self.latency_s: float | None = None
        #: The admission with the most calls left: (admitted at, its calls).
        self._deepest: tuple[float, int] | None = None
        #: Units held before any call here has ended, and what releases them at the cap.
        self._cold: list[tuple[asyncio.AbstractEventLoop, int, asyncio.Future[None]]] = []
        self._cold_timer: asyncio.TimerHandle | None = None
        #: Where the last spread hold fell in its range, in [0, 1).
        self._spread = 0.0
        #: Waiting units that asked to be spread over their slack.
        self._spreading: set[asyncio.Future[None]] = set()
        #: Held units by what they go together with, and the reverse.
        self._held: dict[Hashable, set[asyncio.Future[None]]] = {}
        self._held_with: dict[asyncio.Future[None], Hashable] = {}
        #: When a unit of each ``together`` was last admitted, oldest first.
        self._went: OrderedDict[Hashable, float] = OrderedDict()

    def observe_latency(self, seconds: float) -> None:
        """An answered call's time at the judge (its waits on this side for a place, a
        rate-limit turn or a connection left out): the pace at which chains advance when
        nothing holds them."""
        if self.latency_s is None:
            self.latency_s = seconds
        else:
            self.latency_s += LATENCY_WEIGHT * (seconds - self.latency_s)
        self.call_ended()

    def call_ended(self) -> None:
        """A judge call ended, answered or not: units held for the first one go."""
        if self._cold_timer is not None:
            self._cold_timer.cancel()
            self._cold_timer = None
        cold, self._cold = self._cold, []
        for loop, priority, granted in cold:
            self._back_from_hold(loop, priority, granted)

    def deepest_left(self) -> int:
        """Calls of the deepest admitted chain not answered yet, by the smoothed latency
        (the call under way counts)."""
        if self._deepest is None:
            return 0
        at, calls = self._deepest
        if not self.latency_s:
            return calls
        return math.ceil(calls - (self._clock() - at) / self.latency_s)

    def hold_s(self, priority: int, spread: bool = False) -> float:
        """How long a unit of ``priority`` calls is held at its turn (0: not at all; with
        no latency known yet, ``MAX_HOLD_S`` unless a call ends first): one latency,
        plus, with ``spread``, a share of the slack beyond the margin."""
        if self.deepest_left() - priority < HOLD_MARGIN:
            return 0.0
        if self.latency_s is None:
            return MAX_HOLD_S
        return min(self.latency_s + (self._spread_s(priority) if spread else 0.0), MAX_HOLD_S)

    def _spread_s(self, priority: int) -> float:
        beyond_margin = self.deepest_left() - priority - HOLD_MARGIN
        if beyond_margin <= 0 or not self.latency_s:
            return 0.0
        self._spread = (self._spread + GOLDEN_STEP) % 1.0
        return self._spread * beyond_margin * self.latency_s

    async def wait(self, priority: int, spread: bool = False, together: Together = None) -> None:
        """Return when admitted (``priority``: the unit's calls to make; more goes first;
        ``spread``: a unit nothing else waits on, which may use its slack; ``together``:
        what it goes with, see above)."""
        granted = self._waiters.add(priority, together=together)
        if spread:
            self._spreading.add(granted)
        self._schedule(asyncio.get_running_loop())
        try:
            await granted
        finally:
            self._spreading.discard(granted)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._admit, loop)

    def _admit(self, loop: asyncio.AbstractEventLoop) -> None:
        # Deepest first, so the units of one delivery are weighed against the deepest
        # of them, whatever order they queued in.
        admitted = 0
        while admitted < self.per_tick:
            waiter = self._waiters.pop()
            if waiter is None:
                break
            priority, held, granted, together = waiter
            hold = 0.0 if held or self._went_lately(together) else self.hold_s(priority, granted in self._spreading)
            if hold > 0:
                if together is not None:
                    self._held.setdefault(together, set()).add(granted)
                    self._held_with[granted] = together
                if self.latency_s is None:
                    self._hold_cold(loop, priority, granted)
                else:
                    loop.call_later(hold, self._back_from_hold, loop, priority, granted)
                continue
            self._go(priority, granted)
            admitted += 1
            if together is not None:
                self._went[together] = self._clock()
                self._went.move_to_end(together)
                held_siblings = self._held.pop(together, set())
                for sibling in held_siblings:
                    del self._held_with[sibling]
                for sibling in [*self._waiters.siblings(together), *held_siblings]:
                    if not sibling.done():
                        self._go(priority, sibling)
        self._scheduled = False
        if self._waiters:
            self._schedule(loop)

    def _go(self, priority: int, granted: asyncio.Future[None]) -> None:
        granted.set_result(None)
        if priority > self.deepest_left():
            self._deepest = (self._clock(), priority)

    def _went_lately(self, together: Together) -> bool:
        """Whether a unit that goes with ``together`` was admitted within one judge
        latency (``MAX_HOLD_S`` before one is known): its prefix is fresh at the judge."""
        window = self.latency_s if self.latency_s is not None else MAX_HOLD_S
        now = self._clock()
        while self._went and now - next(iter(self._went.values())) > window:
            self._went.popitem(last=False)
        return together is not None and together in self._went

    def _hold_cold(self, loop: asyncio.AbstractEventLoop, priority: int, granted: asyncio.Future[None]) -> None:
        self._cold.append((loop, priority, granted))
        if self._cold_timer is None:
            self._cold_timer = loop.call_later(MAX_HOLD_S, self.call_ended)

    def _back_from_hold(self, loop: asyncio.AbstractEventLoop, priority: int, granted: asyncio.Future[None]) -> None:
        together = self._held_with.pop(granted, None)
        if together is not None:
            _leave(self._held, together, granted)
        if not granted.done():  # a unit cancelled during its hold is gone
            self._waiters.add(priority, granted, held=True, together=together)
            self._schedule(loop)


def _leave(groups: dict[Hashable, set[asyncio.Future[None]]], together: Hashable, unit: asyncio.Future[None]) -> None:
    """Take ``unit`` out of its group, and the group out once it is empty."""
    members = groups[together]
    members.discard(unit)
    if not members:
        del groups[together]
