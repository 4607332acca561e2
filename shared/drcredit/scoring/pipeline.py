"""The scoring pipeline as the API, the CLI and the workers see it: one object per process.

:class:`Pipeline` wires the parts over one database, one judge and one dispatcher, and
forwards to them; it holds no logic of its own. Where each step lives:

- :mod:`~drcredit.scoring.intake.ingest` and :mod:`~drcredit.scoring.intake.planning`: groups, batches
  and streamed rollouts stored, and their work units planned;
- :mod:`~drcredit.scoring.work.lifecycle`: units claimed under a lease, run, released;
  :mod:`~drcredit.scoring.work.recovery`: lost work found again;
- :mod:`~drcredit.scoring.work.unit_kinds`: what a unit of each kind does
  (:mod:`~drcredit.scoring.work.visit_chain`, :mod:`~drcredit.scoring.work.snippet_unit`,
  :mod:`~drcredit.scoring.work.outcome_unit`), through :class:`~drcredit.scoring.work.unit_context.UnitContext`;
- :mod:`~drcredit.scoring.work.judging`: judge calls, each distinct request once per group;
- :mod:`~drcredit.scoring.work.writes` and :mod:`~drcredit.scoring.work.snippet_release`: every
  answer stored, units finished, waiting snippet calls decided, the aggregation flip;
- :mod:`~drcredit.scoring.results.aggregation`: credits and advantages, or the group's failure.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Collection, Sequence
from concurrent.futures import Future

from drcredit.domain.batch import BatchIn
from drcredit.domain.group import GroupIn, Rollout
from drcredit.domain.limits import Limits
from drcredit.domain.usage import JudgePrice
from drcredit.judges.base import Judge
from drcredit.scoring.dispatch import Dispatcher, UnitRef
from drcredit.scoring.engine import Engine
from drcredit.scoring.intake.content import Dumped
from drcredit.scoring.intake.ingest import Hold, Ingest, Submitted
from drcredit.scoring.results.aggregation import Aggregator
from drcredit.scoring.results.events import GroupEvents
from drcredit.scoring.work import recovery
from drcredit.scoring.work.judging import JudgeCalls
from drcredit.scoring.work.leases import LeaseKeeper
from drcredit.scoring.work.lifecycle import UnitLifecycle
from drcredit.scoring.work.outages import JudgeOutages
from drcredit.scoring.work.reuse import ReusePolicy
from drcredit.scoring.work.rollout_cache import DEFAULT_CONTENT_BUDGET, RolloutCache
from drcredit.scoring.work.snippet_release import SnippetRelease
from drcredit.scoring.work.unit_context import UnitContext
from drcredit.scoring.work.units import UnitOutcome
from drcredit.scoring.work.writes import JudgmentWriter
from drcredit.storage.database import Database

log = logging.getLogger("drcredit.pipeline")

__all__ = ["Pipeline", "Submitted"]


class Pipeline:
    """Ingest, unit execution and aggregation over one database and one judge."""

    def __init__(
        self,
        db: Database,
        judge: Judge,
        dispatcher: Dispatcher,
        *,
        default_failure_policy: str = "zero",
        lease_s: float = 120.0,
        worker_id: str | None = None,
        claims: bool = False,
        judge_concurrency: int = 64,
        db_threads: int = 6,
        write_linger_s: float = 0.05,
        store_patience_s: float = 600.0,
        limits: Limits | None = None,
        rollout_cache_bytes: int = DEFAULT_CONTENT_BUDGET,
        judge_price: JudgePrice | None = None,
        reuse: ReusePolicy | None = None,
        budget_window_s: float | None = None,
    ):
        self.db = db
        self.judge = judge
        self.dispatcher = dispatcher
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self._stopping = threading.Event()
        #: Long-polls of this process wait on these reports of finished groups.
        self.events = GroupEvents()
        self.engine = Engine(judge_concurrency, db_threads)
        if judge.fleet is not None:
            # The engine's judge slots are shared between tenants as the fleet's places are.
            self.engine.judge_slots.weight = judge.fleet.shares.weight
        self.engine.on_close(judge.aclose)
        self.outages = JudgeOutages(db, judge.breaker, self.engine.db, judge.fleet)
        self.leases = LeaseKeeper(db, lease_s, self.engine.db)
        self.engine.on_close(self.leases.stop)
        self.rollouts = RolloutCache(db, self.engine, rollout_cache_bytes)
        self.snippets = SnippetRelease(db, dispatcher, self.rollouts)
        self.writer = JudgmentWriter(
            db,
            self.engine,
            dispatcher,
            self.leases,
            self.snippets,
            self._stopping,
            store_patience_s=store_patience_s,
            linger_s=write_linger_s,
        )
        self.judging = JudgeCalls(
            db,
            self.engine,
            self.outages,
            self._stopping,
            claims=claims,
            worker_id=self.worker_id,
            lease_s=lease_s,
            price=judge_price,
            reuse=reuse,
        )
        if self.judging.store is not None:
            self.engine.on_close(self.judging.store.flush)
        self.aggregator = Aggregator(db, self.rollouts, self.events, judge_price, budget_window_s)
        self.units = UnitLifecycle(
            UnitContext(
                judge=judge,
                engine=self.engine,
                db=db,
                rollouts=self.rollouts,
                judging=self.judging,
                writer=self.writer,
                snippets=self.snippets,
                stopping=self._stopping,
                fail_group=self.aggregator.fail,
            ),
            self.leases,
            worker_id=self.worker_id,
            lease_s=lease_s,
        )
        self.ingest = Ingest(
            db,
            judge,
            dispatcher,
            limits=limits or Limits(),
            default_failure_policy=default_failure_policy,
        )

    # ------------------------------------------------------------------ ingest

    def submit_group(
        self,
        tenant: str,
        group: GroupIn,
        *,
        position: int | None = None,
        prepared: tuple[Dumped, str] | None = None,
        hold: Hold | None = None,
    ) -> Submitted:
        return self.ingest.submit_group(tenant, group, position=position, prepared=prepared, hold=hold)

    def submit_batch(self, tenant: str, batch: BatchIn, hold: Hold | None = None) -> tuple[str, list[Submitted], bool]:
        return self.ingest.submit_batch(tenant, batch, hold)

    def add_rollout(self, tenant: str, group_id: str, rollout: Rollout) -> tuple[Submitted, bool]:
        return self.ingest.add_rollout(tenant, group_id, rollout)

    # ------------------------------------------------------------------ units

    def warm(self) -> None:
        """Prepare the judge on the engine loop before work arrives, in the background (see
        :meth:`~drcredit.judges.base.Judge.awarm`); what it could not prepare, the first
        call does."""

        def warmed(future: Future[None]) -> None:
            error = None if future.cancelled() else future.exception()
            if error is not None:
                log.warning("judge warm-up failed (the first call prepares it): %s: %s", type(error).__name__, error)

        self.engine.submit(self.judge.awarm()).add_done_callback(warmed)

    def submit_units(self, refs: Sequence[UnitRef]) -> Future[list[UnitOutcome]]:
        """Start units on the engine loop; the future holds one outcome per unit."""
        return self.engine.submit(self.units.run(refs))

    def run_units(self, refs: Sequence[UnitRef]) -> list[UnitOutcome]:
        """Run units to completion from a thread outside the engine (a Celery task)."""
        return self.submit_units(refs).result()

    def submit_aggregation(self, group_pk: int) -> Future[None]:
        return self.engine.submit(self.engine.db(self.run_aggregation, group_pk))

    def run_aggregation(self, group_pk: int) -> None:
        with self.engine.busy():
            self.aggregator.run(group_pk)

    def fail_group(self, group_pk: int, reason: str) -> None:
        self.aggregator.fail(group_pk, reason)

    # ------------------------------------------------------------------ recovery

    def resume(self) -> int:
        """Re-dispatch the unfinished work of every open group (after a restart)."""
        return recovery.resume(self.db, self.dispatcher, self.snippets)

    def sweep(self, stale_after_s: float, skip_kinds: Collection[str] = (), skip_aggregations: bool = False) -> int:
        """Re-dispatch work whose broker message may be lost, except the units of
        ``skip_kinds`` and, with ``skip_aggregations``, aggregations (their queue has no live
        consumer); returns units re-dispatched."""
        return recovery.sweep(self.db, self.dispatcher, self.snippets, stale_after_s, skip_kinds, skip_aggregations)

    def stop(self) -> None:
        """Ask running units to return after their current judge call (resumable)."""
        self._stopping.set()

    @property
    def stopping(self) -> threading.Event:
        """Set once :meth:`stop` is called (an embedded audit stops with the units)."""
        return self._stopping
