"""Where work units run: the engine of this process, or (distributed) Celery queues."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal, Protocol

log = logging.getLogger(__name__)

UnitKind = Literal["visit_chain", "snippet", "outcome"]

#: Units sent together (one message, one claim transaction): a group's visit chains, at
#: most this many per message.
MAX_UNITS_PER_MESSAGE = 64


@dataclass(frozen=True)
class UnitRef:
    kind: UnitKind
    unit_id: int
    group_pk: int
    rollout_id: str = ""


def unit_batches(units: Sequence[UnitRef], size: int = MAX_UNITS_PER_MESSAGE) -> Iterator[list[UnitRef]]:
    """Units grouped into messages, in order, at most ``size`` per message.

    By (kind, group): a group's units are dispatched together when it is stored, so one
    message and one claim transaction serve all of them (or ``size``) instead of one per
    rollout. A step's first wave is hundreds of messages arriving at once; per rollout,
    the later ones waited behind the others' claims (BENCHMARKS.md, fifth round). Outcome
    units stay per rollout: a streamed rollout's unit goes alone anyway.
    """
    grouped: dict[tuple[str, int, str], list[UnitRef]] = {}
    for unit in units:
        rollout = unit.rollout_id if unit.kind == "outcome" else ""
        grouped.setdefault((unit.kind, unit.group_pk, rollout), []).append(unit)
    for refs in grouped.values():
        for start in range(0, len(refs), size):
            yield refs[start : start + size]


class Dispatcher(Protocol):
    def dispatch(self, units: Sequence[UnitRef]) -> None: ...

    def dispatch_aggregation(self, group_pk: int) -> None: ...

    def dispatch_audit(self, audit_pk: int) -> None: ...


class InProcessDispatcher:
    """Runs units on this process's engine (embedded mode).

    ``wait_idle`` lets the CLI and tests block until all work is done.
    """

    def __init__(self) -> None:
        self._pending = 0
        self._closed = False
        self._idle = threading.Condition()
        self.submit_units: Callable[[Sequence[UnitRef]], Future[Any]] | None = None
        self.submit_aggregation: Callable[[int], Future[Any]] | None = None
        #: Runs an audit (drcredit.audit.service.run) apart from the units.
        self.submit_audit: Callable[[int], Future[Any]] | None = None

    def bind(
        self,
        submit_units: Callable[[Sequence[UnitRef]], Future[Any]],
        submit_aggregation: Callable[[int], Future[Any]],
    ) -> None:
        self.submit_units, self.submit_aggregation = submit_units, submit_aggregation

    def dispatch(self, units: Sequence[UnitRef]) -> None:
        assert self.submit_units is not None, "dispatcher not bound"
        for batch in unit_batches(units):
            if self._admit(batch):
                self._track(self.submit_units(batch))

    def dispatch_aggregation(self, group_pk: int) -> None:
        assert self.submit_aggregation is not None, "dispatcher not bound"
        if self._admit(group_pk):
            self._track(self.submit_aggregation(group_pk))

    def dispatch_audit(self, audit_pk: int) -> None:
        assert self.submit_audit is not None, "dispatcher not bound for audits"
        if self._admit(("audit", audit_pk)):
            self._track(self.submit_audit(audit_pk))

    def _admit(self, work: object) -> bool:
        with self._idle:
            if self._closed:
                # Shutting down: the unit stays queued in the database and is resumed
                # by the next start (Pipeline.resume).
                log.debug("dispatcher closed; %s left for the next start", work)
                return False
            self._pending += 1
            return True

    def _track(self, future: Future[Any]) -> None:
        future.add_done_callback(self._done)

    def _done(self, future: Future[Any]) -> None:
        exc = None if future.cancelled() else future.exception()
        if exc is not None:
            log.error("work unit crashed", exc_info=exc)
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def shutdown(self, timeout: float = 60.0) -> None:
        """Stop taking work and wait for what is running (it stops after its current call)."""
        with self._idle:
            self._closed = True
        if not self.wait_idle(timeout):
            log.warning("units still running after %.0fs; they resume at the next start", timeout)
