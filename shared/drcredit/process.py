"""Process-wide tuning for the long-running processes (API, workers, the embedded job)."""

from __future__ import annotations

import asyncio
import gc


def tune_gc(threshold: int) -> None:
    """Collect cyclic garbage less often, and never rescan what start-up allocated.

    A unit's judge call allocates thousands of short-lived objects (prompt documents,
    request and response bodies, rows); with Python's default first-generation
    threshold (700) the collector ran about a thousand times per step in a visit
    worker and its full collections walked every cached rollout: a third of the
    worker's CPU in the benchmark (BENCHMARKS.md). Most of those objects die by
    reference counting before a collection at a higher threshold, which is all this
    changes; cycles are still collected. ``threshold`` 0 keeps Python's defaults.
    """
    if threshold <= 0:
        return
    gc.collect()
    # Modules, classes and settings allocated at start-up live as long as the process.
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(threshold, second, third)


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
