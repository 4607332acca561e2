"""Process-wide tuning for the long-running processes (API, workers, the embedded job)."""

from __future__ import annotations

import asyncio
import gc
import threading


def tune_gc(threshold: int) -> None:
    """Collect cyclic garbage less often, and never rescan what start-up allocated.

    A unit's judge call allocates thousands of short-lived objects (prompt documents,
    request and response bodies, rows); with Python's default first-generation
    threshold (700) the collector ran about a thousand times per step in a visit
    worker and its full collections walked every cached rollout: a third of the
    worker's CPU in the benchmark (BENCHMARKS.md). Most of those objects die by
    reference counting before a collection at a higher threshold, which is all this
    changes; cycles are still collected, mostly while no unit runs (see
    :class:`IdleCollector`). ``threshold`` 0 keeps Python's defaults.
    """
    if threshold <= 0:
        return
    gc.collect()
    # Modules, classes and settings allocated at start-up live as long as the process.
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(threshold, second, third)


class IdleCollector:
    """Collects cyclic garbage when the process has no work running.

    What a collection costs is the live objects it walks, and in the middle of a step
    those are the calls in flight (coroutines, requests, responses): nearly all of them
    survive, so a collection then is a pause of the engine loop that frees little. With
    the first-generation threshold above a step's growth in live objects, the garbage of
    a step is collected here, once its work is done, when the walk is short and delays
    no judge call. Work (a delivery's units, an aggregation) may start and end on any
    thread; the collection runs on the engine loop ``delay_s`` after the last work ended,
    unless more has started since (a worker between two deliveries is not idle).
    """

    def __init__(self, delay_s: float = 0.5) -> None:
        self.delay_s = delay_s
        self._lock = threading.Lock()
        self._running = 0
        self._starts = 0
        #: Collections made here.
        self.collections = 0

    @property
    def running(self) -> int:
        return self._running

    def started(self) -> None:
        with self._lock:
            self._running += 1
            self._starts += 1

    def finished(self, loop: asyncio.AbstractEventLoop) -> None:
        """Work ended; the last running arms a collection on ``loop``."""
        with self._lock:
            self._running -= 1
            if self._running > 0:
                return
            starts = self._starts
        try:
            loop.call_soon_threadsafe(loop.call_later, self.delay_s, self._collect, starts)
        except RuntimeError:  # the loop is closed: the process is stopping
            pass

    def _collect(self, starts: int) -> None:
        with self._lock:
            if self._running > 0 or self._starts != starts or not gc.isenabled():
                return
        # The oldest generation too once the collector itself would take it at its next
        # collection: a full walk (every cached rollout) belongs here, not in a step.
        gc.collect(2 if gc.get_count()[2] >= gc.get_threshold()[2] else 1)
        self.collections += 1


def raise_open_files_limit(wanted: int = 65536) -> None:
    """Raise this process's soft limit on open files towards ``wanted`` (never past the hard
    limit): every judge call in flight holds a socket, and many systems start processes
    with a soft limit of 1,024."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (not on Windows), else asyncio's.

    A worker's engine loop runs hundreds of judge calls at once; uvloop's C loop and
    transports cut its CPU per call by about 7% in the benchmark (BENCHMARKS.md), the
    same loop uvicorn already picks for the API.
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows, or a minimal install
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
