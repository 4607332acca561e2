"""Where work units run: a thread pool in this process, or (distributed) Celery queues."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, Protocol

log = logging.getLogger(__name__)

UnitKind = Literal["visit_chain", "snippet"]


@dataclass(frozen=True)
class UnitRef:
    kind: UnitKind
    unit_id: int
    group_pk: int


class Dispatcher(Protocol):
    def dispatch(self, units: Sequence[UnitRef]) -> None: ...

    def dispatch_aggregation(self, group_pk: int) -> None: ...


class InProcessDispatcher:
    """Runs units on a bounded thread pool of this process (embedded mode).

    A chain waiting on the judge holds a thread, so the pool size is the number of judge
    calls in flight; ``wait_idle`` lets the CLI and tests block until all work is done.
    """

    def __init__(self, max_workers: int):
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="drcredit-unit")
        self._pending = 0
        self._closed = False
        self._idle = threading.Condition()
        self.run_unit: Callable[[UnitRef], Any] | None = None
        self.run_aggregation: Callable[[int], None] | None = None

    def bind(self, run_unit: Callable[[UnitRef], Any], run_aggregation: Callable[[int], None]) -> None:
        self.run_unit, self.run_aggregation = run_unit, run_aggregation

    def dispatch(self, units: Sequence[UnitRef]) -> None:
        for unit in units:
            self._submit(self._call_unit, unit)

    def dispatch_aggregation(self, group_pk: int) -> None:
        self._submit(self._call_aggregation, group_pk)

    def _call_unit(self, unit: UnitRef) -> None:
        assert self.run_unit is not None, "dispatcher not bound"
        self.run_unit(unit)

    def _call_aggregation(self, group_pk: int) -> None:
        assert self.run_aggregation is not None, "dispatcher not bound"
        self.run_aggregation(group_pk)

    def _submit(self, fn: Callable[..., None], arg: object) -> None:
        with self._idle:
            if self._closed:
                # Shutting down: the unit stays queued in the database and is resumed
                # by the next start (Pipeline.resume).
                log.debug("dispatcher closed; %s left for the next start", arg)
                return
            self._pending += 1
        future: Future[None] = self._pool.submit(fn, arg)
        future.add_done_callback(self._done)

    def _done(self, future: Future[None]) -> None:
        exc = None if future.cancelled() else future.exception()
        if exc is not None:
            log.error("work unit crashed", exc_info=exc)
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def shutdown(self) -> None:
        """Stop taking work, drop what has not started, wait for what is running."""
        with self._idle:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
