"""What a process tells others about a judge outage (docs/method.md, "Judge failures").

The judge's circuit breaker (drcredit.judges.breaker) makes judgments wait while the
judge cannot be reached. This part makes the wait visible: the endpoint's state goes to
the ``judge_endpoints`` table (read by ``/readyz`` and the status documents, whichever
process noticed), the groups with judgments waiting in this process get
``judge_waiting_since``, and the outage is counted in the metrics.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from drcredit import metrics
from drcredit.judges.breaker import BreakerState, CircuitBreaker
from drcredit.judges.fleet.router import Endpoint, Fleet
from drcredit.storage import models as m
from drcredit.storage.database import Database, insert_for

log = logging.getLogger("drcredit.outages")


class JudgeOutages:
    def __init__(self, db: Database, breaker: CircuitBreaker, run_db: Callable[..., Any], fleet: Fleet | None = None):
        """``run_db(fn, *args)``: an awaitable running ``fn`` on a database thread;
        ``fleet``: the judge's endpoints, each recorded when it leaves or rejoins the rotation."""
        self.db = db
        self.breaker = breaker
        self._run_db = run_db
        #: Judgments in flight in this process, per group (engine loop only).
        self._judging: Counter[int] = Counter()
        #: Groups this process marked as waiting, to clear when the judge is back.
        self._marked: set[int] = set()
        self._tasks: set[asyncio.Future[Any]] = set()
        metrics.JUDGE_UP.labels(breaker.endpoint).set(1)
        breaker.add_listener(self._changed)
        if fleet is not None:
            fleet.listeners.append(self._endpoint_changed)

    def _endpoint_changed(self, endpoint: Endpoint, up: bool) -> None:
        """One endpoint of several left or rejoined the rotation: record it (the judge
        as a whole is unreachable only when its own breaker opens)."""
        health = endpoint.health
        state = BreakerState(endpoint.url, up, health.since, health.reason, health.outages)
        if not up:
            metrics.JUDGE_OUTAGES.labels(endpoint.url).inc()
        self._submit(self._record, state, [])

    @contextmanager
    def judging(self, group_pk: int) -> Iterator[None]:
        """Around a judgment of ``group_pk``: mark the group if it starts during an outage."""
        self._judging[group_pk] += 1
        if self.breaker.is_open and group_pk not in self._marked:
            self._mark([group_pk], self.breaker.state())
        try:
            yield
        finally:
            self._judging[group_pk] -= 1
            if self._judging[group_pk] <= 0:
                del self._judging[group_pk]

    def _changed(self, state: BreakerState) -> None:
        metrics.JUDGE_UP.labels(state.endpoint).set(1 if state.up else 0)
        if state.up:
            log.warning("judge %s reachable again", state.endpoint)
            groups, self._marked = list(self._marked), set()
        else:
            metrics.JUDGE_OUTAGES.labels(state.endpoint).inc()
            log.warning(
                "judge %s unreachable: %s; judgments wait for it (up to %g s)",
                state.endpoint,
                state.reason,
                self.breaker.deadline_s,
            )
            groups = [g for g in self._judging if g not in self._marked]
            self._marked.update(groups)
        self._submit(self._record, state, groups)

    def _mark(self, groups: list[int], state: BreakerState) -> None:
        self._marked.update(groups)
        self._submit(self._record, state, groups)

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            fn(*args)
            return
        task = asyncio.ensure_future(self._run_db(fn, *args), loop=loop)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("could not record the judge's state", exc_info=task.exception())

    def _record(self, state: BreakerState, groups: list[int]) -> None:
        with self.db.session() as s:
            record_endpoint(s, state)
            if groups:
                waiting = (
                    {"judge_waiting_since": None, "judge_waiting_reason": None}
                    if state.up
                    else {"judge_waiting_since": state.since, "judge_waiting_reason": state.reason}
                )
                s.execute(update(m.Group).where(m.Group.id.in_(groups)).values(**waiting))


def record_endpoint(s: Session, state: BreakerState) -> None:
    """Record the endpoint's state. Its row is created first if missing (an insert that
    does nothing when another writer created it meanwhile), then locked and changed: two
    processes or two of a process's transitions noticing a first outage at once both
    inserted it, and the one that lost failed, with the groups' ``waiting_for_judge``
    it carried."""
    stamp = datetime.now(UTC)
    first = {"endpoint": state.endpoint, "state": "up", "since": state.since, "outages": 0, "updated_at": stamp}
    s.execute(insert_for(s, m.JudgeEndpoint).values(**first).on_conflict_do_nothing(index_elements=["endpoint"]))
    row = s.get(m.JudgeEndpoint, state.endpoint, with_for_update=True, populate_existing=True)
    assert row is not None  # inserted above, or by another writer
    was_up = row.state == "up"
    row.state = "up" if state.up else "down"
    row.reason = state.reason
    row.updated_at = stamp
    if was_up != state.up:
        row.since = state.since
        row.outages += 0 if state.up else 1


def endpoint_states(s: Session) -> list[dict[str, Any]]:
    """Every judge endpoint's last known state, for ``/readyz`` and the status documents."""
    return [
        {
            "endpoint": row.endpoint,
            "state": row.state,
            "since": row.since.isoformat(),
            "reason": row.reason,
            "outages": row.outages,
        }
        for row in s.scalars(select(m.JudgeEndpoint).order_by(m.JudgeEndpoint.endpoint))
    ]
