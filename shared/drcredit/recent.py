"""A bounded map that forgets its least recently used entries: one home for the caches
a long-lived process keeps (a worker's rollout content and plans, the fleet's affinity
pins, the SkyRL generator's scored uids), so none of them grows without bound.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Recent(Generic[K, V]):
    """A thread-safe map that forgets the least recently used entries past its bounds.

    A worker keeps what never changes once stored (rollout content, plans, group
    parameters) for the units that come back to it; the engine loop and the database
    threads read it concurrently. ``size`` bounds the entries; with ``budget``, the
    weights given to :meth:`put` are bounded too (rollout content, whose size varies
    with its pages: a count alone let a worker grow past a container's memory limit).
    The newest entry is always kept.
    """

    def __init__(self, size: int = 4096, budget: int | None = None):
        self.size = size
        self.budget = budget
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()

    @property
    def weight(self) -> int:
        """The summed weights of the entries kept."""
        return self._weight

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: K, value: V, weight: int = 0) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._weight -= old[1]
            self._entries[key] = (value, weight)
            self._weight += weight
            while len(self._entries) > 1 and (
                len(self._entries) > self.size or (self.budget is not None and self._weight > self.budget)
            ):
                _, (_, dropped) = self._entries.popitem(last=False)
                self._weight -= dropped

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries
