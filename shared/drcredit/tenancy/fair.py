"""Fair shares of the judge fleet: each tenant's part of it, and which call goes next.

Two rules, both pure:

- :func:`allocate` splits the fleet's capacity (its endpoints' learned concurrency)
  between the tenants with calls waiting or in flight, in proportion to their weights,
  by water-filling: a tenant that needs less than its part (its demand) or may hold
  less (``max_share``) keeps what it needs and the rest is split again among the
  others, so an idle tenant's part goes to the others at once. What no tenant's demand
  takes is split by weight among those not capped, so a call that arrives between two
  reports starts at once. :func:`process_parts` turns the fleet-wide parts into one
  process's: each tenant's part in proportion to this process's share of its demand.
- :class:`FairQueue` orders one process's waiting calls: tenants by start-time fair
  queueing (each tenant's virtual time advances by 1/weight per call placed, and the
  tenant with the least goes next; a tenant that was idle starts from the current
  virtual time, so it neither banks its idle time nor waits for the others' past);
  within a tenant training before audits, then its runs in turn (equal weights, the
  same rule), then the run's calls by priority (the calls their chain still has to
  make), arrival order among equals.

Why start-time fair queueing rather than deficit round robin: every call costs one
place for about one latency, so the quantum DRR needs is one call, and SFQ's virtual
times give the same shares with weights that are arbitrary reals and change at every
report (a process's parts), with no rounds to restart.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from drcredit.tenancy.owner import Owner

T = TypeVar("T")


def allocate(
    demands: Mapping[str, float],
    weights: Mapping[str, float],
    caps: Mapping[str, float],
    capacity: float,
) -> dict[str, float]:
    """Each tenant's part of ``capacity`` (tenants with demand only).

    ``weights`` and ``caps`` (the most a tenant may hold, in capacity units) default
    to 1 and no cap. Water-filling: a tenant whose demand or cap is below its weighted
    part of what is left keeps that; the rest split what remains by weight. Capacity
    no demand takes is then spread by weight over the tenants below their caps.
    """
    active = {t for t, d in demands.items() if d > 0}
    out: dict[str, float] = {}
    left = float(capacity)
    pending = set(active)
    while pending:
        total_w = sum(weights.get(t, 1.0) for t in pending)
        fair = {t: left * weights.get(t, 1.0) / total_w for t in pending}
        settled = {t for t in pending if min(demands[t], caps.get(t, capacity)) <= fair[t]}
        if not settled:
            out.update(fair)
            left = 0.0
            break
        for t in settled:
            out[t] = min(demands[t], caps.get(t, capacity))
            left -= out[t]
        pending -= settled
    # Headroom nobody's demand took: by weight to those below their cap.
    while left > 1e-9:
        open_ = [t for t in active if out[t] < caps.get(t, capacity) - 1e-9]
        if not open_:
            break
        total_w = sum(weights.get(t, 1.0) for t in open_)
        given = 0.0
        for t in open_:
            extra = min(left * weights.get(t, 1.0) / total_w, caps.get(t, capacity) - out[t])
            out[t] += extra
            given += extra
        left -= given
    return out


@dataclass(frozen=True)
class ProcessParts:
    """A process's part of the fleet: the fraction of every endpoint's limit it may
    use, and each tenant's part of that (in capacity units, for the order of its calls
    and the cap of a tenant with ``max_share``)."""

    fraction: float
    tenants: dict[str, float]
    caps: dict[str, float]


def process_parts(
    own: Mapping[str, float],
    fleet: Mapping[str, float],
    weights: Mapping[str, float],
    max_shares: Mapping[str, float],
    capacity: float,
    processes: int,
) -> ProcessParts:
    """This process's parts from its demand per tenant (``own``) and the fleet's
    (``fleet``, every live process's summed, this one's included).

    Each tenant's fleet part (:func:`allocate`) is split between processes in proportion
    to their demand of it. With no demand anywhere the limit is split evenly between
    the ``processes``. A tenant with ``max_share`` below 1 is capped here at its share
    of its capped part (at least one call).
    """
    if capacity <= 0 or sum(fleet.values()) <= 0:
        return ProcessParts(1.0 / max(processes, 1), {}, {})
    caps = {t: s * capacity for t, s in max_shares.items() if s < 1}
    parts = allocate(fleet, weights, caps, capacity)
    mine = {t: parts[t] * own[t] / fleet[t] for t in own if own[t] > 0 and fleet.get(t, 0) > 0 and t in parts}
    fraction = min(1.0, sum(mine.values()) / capacity)
    own_caps = {t: max(1.0, caps[t] * own[t] / fleet[t]) for t in mine if t in caps}
    return ProcessParts(fraction, mine, own_caps)


@dataclass
class _Flow:
    """Calls of one tenant (or one run) with its virtual time."""

    vtime: float = 0.0
    waiting: int = 0


@dataclass
class _Run(Generic[T]):
    flow: _Flow = field(default_factory=_Flow)
    heap: list[tuple[int, int, T]] = field(default_factory=list)


@dataclass
class _Class(Generic[T]):
    runs: dict[str, _Run[T]] = field(default_factory=dict)
    clock: float = 0.0

    @property
    def waiting(self) -> int:
        return sum(len(r.heap) for r in self.runs.values())


@dataclass
class _Tenant(Generic[T]):
    flow: _Flow = field(default_factory=_Flow)
    #: Training, then audit.
    classes: tuple[_Class[T], _Class[T]] = field(default_factory=lambda: (_Class(), _Class()))


class FairQueue(Generic[T]):
    """Waiting calls in the order they should be placed (see the module's rules).

    ``weight``: a tenant's weight now (read at every choice, so it may change).
    :meth:`first` looks without taking; :meth:`pop_first` and :meth:`pop_last` take a
    call and charge its tenant and run one place.
    """

    def __init__(self, weight: Callable[[str], float] = lambda _t: 1.0):
        self.weight = weight
        self._tenants: dict[str, _Tenant[T]] = {}
        self._clock = 0.0
        self._arrivals = itertools.count()
        #: Arrival numbers of promoted calls: ahead of every plain arrival.
        self._ahead = itertools.count(-(2**62))
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def waiting(self) -> dict[str, int]:
        """Calls waiting per tenant (those with any)."""
        return {name: t.flow.waiting for name, t in self._tenants.items() if t.flow.waiting}

    def push(self, item: T, owner: Owner, priority: int) -> None:
        tenant = self._tenants.setdefault(owner.tenant, _Tenant())
        if tenant.flow.waiting == 0:
            tenant.flow.vtime = max(tenant.flow.vtime, self._clock)
        klass = tenant.classes[1 if owner.audit else 0]
        run = klass.runs.setdefault(owner.run, _Run())
        if not run.heap:
            run.flow.vtime = max(run.flow.vtime, klass.clock)
        heapq.heappush(run.heap, (-priority, next(self._arrivals), item))
        tenant.flow.waiting += 1
        self._size += 1

    def _next_run(self, skip: frozenset[str]) -> tuple[str, _Tenant[T], _Class[T], _Run[T]] | None:
        best: tuple[float, str] | None = None
        for name, t in self._tenants.items():
            if t.flow.waiting and name not in skip and (best is None or (t.flow.vtime, name) < best):
                best = (t.flow.vtime, name)
        if best is None:
            return None
        tenant = self._tenants[best[1]]
        klass = tenant.classes[0] if tenant.classes[0].waiting else tenant.classes[1]
        run_name = min((r for r in klass.runs if klass.runs[r].heap), key=lambda r: (klass.runs[r].flow.vtime, r))
        return best[1], tenant, klass, klass.runs[run_name]

    def promote(self, owner: Owner, priority: int, items: Collection[T]) -> None:
        """Move ``items`` (waiting calls of ``owner`` with ``priority``) ahead of the
        others of that priority in their run, in their order of arrival: calls that share
        a prompt prefix with one just placed go beside it."""
        tenant = self._tenants.get(owner.tenant)
        run = tenant.classes[1 if owner.audit else 0].runs.get(owner.run) if tenant is not None else None
        if run is None or not items:
            return
        moved = sorted(
            (arrival, i)
            for i, (rank, arrival, item) in enumerate(run.heap)
            if rank == -priority and arrival >= 0 and item in items
        )
        for _, i in moved:
            rank, _, item = run.heap[i]
            run.heap[i] = (rank, next(self._ahead), item)
        if moved:
            heapq.heapify(run.heap)

    def first(self, skip: frozenset[str] = frozenset()) -> T | None:
        """The call to place next (``skip``: tenants that may not take a place now)."""
        found = self._next_run(skip)
        return None if found is None else found[3].heap[0][2]

    def pop_first(self, skip: frozenset[str] = frozenset(), *, charge: bool = True) -> T | None:
        """Take the call :meth:`first` names; ``charge``: count it as placed (False:
        a call given up while it waited, which takes nobody's turn)."""
        found = self._next_run(skip)
        if found is None:
            return None
        item = heapq.heappop(found[3].heap)[2]
        self._taken(*found, charge=charge)
        return item

    def pop_first_where(
        self, fits: Callable[[T], bool], skip: frozenset[str] = frozenset(), among: int = 64
    ) -> T | None:
        """Take the most urgent call of the run that goes next for which ``fits`` holds,
        looking at its ``among`` most urgent only (None: none of them): the turn stays
        that run's."""
        found = self._next_run(skip)
        if found is None:
            return None
        heap = found[3].heap
        for entry in heapq.nsmallest(among, heap):
            if fits(entry[2]):
                heap.remove(entry)
                heapq.heapify(heap)
                self._taken(*found, charge=True)
                return entry[2]
        return None

    def last(self, skip: frozenset[str] = frozenset()) -> T | None:
        """The call :meth:`pop_last` would take, left in place."""
        found = self._next_run(skip)
        return None if found is None else max(found[3].heap)[2]

    def pop_last(self, skip: frozenset[str] = frozenset()) -> T | None:
        """Take the least urgent call of the run that goes next (for a place on a slower
        endpoint: the turn stays that run's, the wait falls on its least urgent call)."""
        found = self._next_run(skip)
        if found is None:
            return None
        heap = found[3].heap
        last = max(range(len(heap)), key=heap.__getitem__)
        item = heap[last][2]
        heap[last] = heap[-1]
        heap.pop()
        heapq.heapify(heap)
        self._taken(*found, charge=True)
        return item

    def _taken(self, name: str, tenant: _Tenant[T], klass: _Class[T], run: _Run[T], *, charge: bool) -> None:
        tenant.flow.waiting -= 1
        self._size -= 1
        if charge:
            self._charge(name, tenant, klass, run)

    def _charge(self, name: str, tenant: _Tenant[T], klass: _Class[T], run: _Run[T]) -> None:
        self._clock = tenant.flow.vtime
        tenant.flow.vtime += 1.0 / max(self.weight(name), 1e-9)
        klass.clock = run.flow.vtime
        run.flow.vtime += 1.0
