"""Wiring: settings -> database, judge, dispatcher and pipeline, for any entry point."""

from __future__ import annotations

import functools
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass

from drcredit.audit import leases as audit_leases
from drcredit.audit import service as audit_service
from drcredit.audit.judges import AuditJudges, check_audit_judges
from drcredit.judges import build_judge
from drcredit.judges.base import Judge
from drcredit.scoring.dispatch import Dispatcher, InProcessDispatcher
from drcredit.scoring.pipeline import Pipeline
from drcredit.scoring.work.reuse import ReusePolicy
from drcredit.settings import Settings
from drcredit.storage.database import Database
from drcredit.storage.migrate import schema_problem, upgrade

log = logging.getLogger("drcredit.runtime")


@dataclass
class Runtime:
    settings: Settings
    db: Database
    judge: Judge
    dispatcher: Dispatcher
    pipeline: Pipeline
    #: The operator's audit judges (DRCREDIT_AUDIT_JUDGES), built on first use.
    audits: AuditJudges
    #: Set when the schema is behind this release and migrating at start-up is off: the
    #: API answers 503 with it, a worker exits with it.
    schema_problem: str | None = None

    @classmethod
    def build(cls, settings: Settings, *, dispatcher: Dispatcher | None = None, judge: Judge | None = None) -> Runtime:
        url = settings.resolved_database_url
        if settings.auto_migrate is not False:
            upgrade(url)  # serialized across processes on Postgres
        # Units run as coroutines; only the engine's database threads (and the API's
        # request threads) hold connections, for short transactions, never across a
        # judge call.
        db_threads = settings.database_threads
        pool = max(2, min(db_threads + 4, settings.database_pool_size))
        db = Database(url, pool)
        problem = None if settings.auto_migrate is not False else schema_problem(db.engine)
        judge = judge or build_judge(settings)
        if dispatcher is None:
            if settings.distributed:
                from drcredit.broker.app import create_celery
                from drcredit.broker.dispatch import CeleryDispatcher

                dispatcher = CeleryDispatcher(create_celery(settings))
            else:
                dispatcher = InProcessDispatcher()
        pipeline = Pipeline(
            db,
            judge,
            dispatcher,
            default_failure_policy=settings.on_judge_failure,
            lease_s=settings.lease_s,
            store_patience_s=settings.store_patience_s,
            limits=settings.limits(),
            claims=settings.distributed,
            judge_concurrency=settings.judge_concurrency,
            db_threads=db_threads,
            rollout_cache_bytes=settings.rollout_cache_mb << 20,
            judge_price=settings.judge_price,
            reuse=ReusePolicy(settings.judge_reuse, settings.judge_reuse_max_age_s, settings.judge_reuse_max_entries),
            budget_window_s=settings.budget_window_s,
        )
        audits = AuditJudges(settings, judge)
        pipeline.engine.on_close(audits.aclose)
        if isinstance(dispatcher, InProcessDispatcher):
            # Every group finishes in this process: its long-polls hear of it directly.
            pipeline.events.local = True
            dispatcher.bind(pipeline.submit_units, pipeline.submit_aggregation)
            dispatcher.submit_audit = functools.partial(
                _run_audit_in_background, db, pipeline, audits, pipeline.stopping, settings.budget_window_s
            )
            resumed = pipeline.resume() if problem is None else 0
            if resumed:
                log.info("resumed %d unfinished work units", resumed)
            # Audits this process's last run left (queued, or stopped with it: running,
            # their lease given back) run again; a live process's claim keeps its own, and
            # one held for a budget waits for the API's release at the reset.
            audits_resumed = audit_leases.sweep(db, dispatcher.dispatch_audit, 0.0) if problem is None else 0
            if audits_resumed:
                log.info("resumed %d unfinished audits", audits_resumed)
        return cls(settings, db, judge, dispatcher, pipeline, audits, problem)

    @staticmethod
    def check(settings: Settings) -> None:
        """What :meth:`build` would trip over, without starting anything: API keys, the
        judge's settings, the database (reachable, and migrated unless that is off).
        Raises ValueError or the database's OperationalError."""
        settings.tenant_keys()
        build_judge(settings).close()
        check_audit_judges(settings)
        url = settings.resolved_database_url
        if settings.auto_migrate is not False:
            upgrade(url)
            return
        db = Database(url, 1)
        try:
            db.ping()
        finally:
            db.dispose()

    def close(self) -> None:
        self.audits.close()
        self.pipeline.stop()
        if isinstance(self.dispatcher, InProcessDispatcher):
            self.dispatcher.shutdown()
        self.pipeline.engine.close()
        self.judge.close()
        self.db.dispose()


def _run_audit_in_background(
    db: Database,
    pipeline: Pipeline,
    audits: AuditJudges,
    stop: threading.Event,
    budget_window_s: float | None,
    audit_pk: int,
) -> Future[str]:
    """Embedded mode: run an audit on a thread of its own (it waits on the engine's loop
    for its judge calls, below every training call); it stops with the pipeline, giving
    its claim back, so that it holds no shutdown up."""
    future: Future[str] = Future()

    def run() -> None:
        try:
            future.set_result(audit_service.run(db, pipeline.engine, audits, audit_pk, stop, budget_window_s))
        except BaseException as exc:  # noqa: BLE001 - reported through the future
            future.set_exception(exc)

    threading.Thread(target=run, name=f"drcredit-audit-{audit_pk}", daemon=True).start()
    return future
