"""What every ``drcredit worker`` process runs besides Celery itself.

One :class:`~drcredit.wiring.runtime.Runtime` per process (database pool sized to the
worker's concurrency, one judge client, a Celery dispatcher), a Prometheus endpoint, a
sweeper thread that re-sends work whose message was lost (Redis restarted, a worker was
killed), a heartbeat that says which queues this worker consumes
(:mod:`drcredit.broker.consumers`), and a graceful stop: on SIGTERM running chains hand
their unit back after the current judge call and it is queued again at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import structlog
from celery import Celery, signals
from sqlalchemy.exc import DBAPIError, OperationalError

from drcredit import metrics
from drcredit.audit import leases as audits
from drcredit.broker.app import create_celery
from drcredit.broker.consumers import ConsumerHeartbeat, ConsumerRegistry
from drcredit.broker.dispatch import CeleryDispatcher
from drcredit.broker.queues import ALL_QUEUES, AUDITOR, CREDIT_AGGREGATOR, UNIT_QUEUES
from drcredit.scoring.dispatch import UnitKind, UnitRef
from drcredit.settings import Settings
from drcredit.wiring.runtime import Runtime

log = logging.getLogger("drcredit.worker")

_runtime: Runtime | None = None


@dataclass(frozen=True)
class WorkerConfig:
    """One service's worker settings: its queue, default concurrency and task module."""

    queue: str
    concurrency: int
    tasks_module: str
    pool: str = "threads"
    #: Deployments start it with ``--concurrency`` (its threads), which also caps its
    #: judge calls in flight; False where that cap would starve it (an audit is one
    #: task whose calls run on the engine: 4 threads, but calls up to the judge ceiling).
    pin_concurrency: bool = True


def current_runtime() -> Runtime:
    if _runtime is None:
        raise RuntimeError("the worker runtime is not started (run tasks through `drcredit worker`)")
    return _runtime


def start(settings: Settings, judge_concurrency: int, queues: Collection[str] = ALL_QUEUES) -> tuple[Celery, Runtime]:
    """Build this process's Celery app and runtime, and start its helper threads.

    ``queues``: the queues this worker consumes; its heartbeat says so once Celery is
    ready to take their messages, and withdraws it when Celery stops taking them.
    """
    global _runtime
    if settings.log_level.upper() != "DEBUG":
        # Celery logs every task's success at INFO: hundreds of lines a second under
        # load, each rendered, for what the metrics (drcredit_tasks_total) already count.
        logging.getLogger("celery.app.trace").setLevel(logging.WARNING)
    app = create_celery(settings)
    dispatcher = CeleryDispatcher(app)
    sized = settings.model_copy(update={"judge_concurrency": judge_concurrency})
    _runtime = Runtime.build(sized, dispatcher=dispatcher)
    if settings.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port)
        log.info("metrics on :%d/metrics", settings.metrics_port)
    assert settings.broker_url is not None  # create_celery refused otherwise
    registry = ConsumerRegistry(settings.broker_url)
    heartbeat = ConsumerHeartbeat(registry, queues, settings.metrics_port, settings.consumer_ttl_s)
    Sweeper(_runtime, dispatcher, settings, registry, queues).start()
    # While Celery boots, so that the first step's calls do not wait for it.
    _runtime.pipeline.warm()

    @signals.worker_ready.connect(weak=False)
    def _consuming(**_: Any) -> None:
        heartbeat.start()

    @signals.worker_shutting_down.connect(weak=False)
    def _stop(**_: Any) -> None:
        log.info("worker stopping: running chains hand back their units after the current call")
        heartbeat.stop()
        if _runtime is not None:
            _runtime.pipeline.stop()

    return app, _runtime


class Sweeper(threading.Thread):
    """Periodically re-sends lost work and publishes queue depths.

    A change of the Redis server's run id means it restarted; without persistence its
    queues are empty, so every queued unit is sent again at once instead of waiting.
    Work on a queue no live worker consumes is not sent again (its message waits).
    """

    def __init__(
        self,
        runtime: Runtime,
        dispatcher: CeleryDispatcher,
        settings: Settings,
        registry: ConsumerRegistry,
        own_queues: Collection[str],
    ):
        super().__init__(name="drcredit-sweeper", daemon=True)
        self.runtime = runtime
        self.dispatcher = dispatcher
        self.interval = settings.sweep_interval_s
        self.stale_after = settings.sweep_stale_after_s
        self.registry = registry
        self.own_queues = set(own_queues)
        self.run_id: str | None = None

    def _idle_queues(self) -> set[str]:
        """Queues without a live consumer (this worker's own count as consumed: its
        heartbeat may not have been written yet); none when that cannot be read."""
        try:
            return set(self.registry.census().without_consumer()) - self.own_queues
        except Exception:  # noqa: BLE001 - unknown: re-send as before
            return set()

    def _broker_run_id(self) -> str | None:
        try:
            with self.dispatcher.app.connection_for_read() as conn:
                info = conn.default_channel.client.info("server")
                return str(info.get("run_id"))
        except Exception:  # noqa: BLE001 - broker down: nothing to compare this round
            return None

    def run(self) -> None:
        first = True
        while True:
            try:
                run_id = self._broker_run_id()
                restarted = run_id is not None and self.run_id is not None and run_id != self.run_id
                if run_id is not None:
                    self.run_id = run_id
                stale = 0.0 if restarted else self.stale_after
                if restarted:
                    log.warning("broker restarted (run id changed): re-sending all queued work")
                if first or restarted or run_id is not None:
                    idle = self._idle_queues()
                    kinds = [kind for kind, queue in UNIT_QUEUES.items() if queue in idle]
                    resent = self.runtime.pipeline.sweep(stale, kinds, CREDIT_AGGREGATOR in idle)
                    if AUDITOR not in idle:
                        # An audit's message may wait behind others' (one task each):
                        # queued for a minute, or its worker's lease run out.
                        resent += audits.sweep(
                            self.runtime.db, self.dispatcher.dispatch_audit, max(stale, AUDIT_STALE_S)
                        )
                    metrics.SWEEPS.inc(resent)
                for queue, depth in self.dispatcher.queue_depths().items():
                    metrics.QUEUE_DEPTH.labels(queue).set(depth)
                first = False
            except Exception:
                log.warning("sweep failed; retrying in %.0fs", self.interval, exc_info=True)
            threading.Event().wait(self.interval)


#: A queued audit older than this is sent again (its running lease is renewed well within it).
AUDIT_STALE_S = 60.0

#: Database errors worth retrying (server restarting, connection dropped).
TRANSIENT_DB_ERRORS = (OperationalError,)


def unit_refs(kind: UnitKind, unit_ids: int | list[int], group_pk: int, rollout_id: str) -> list[UnitRef]:
    """The units a message names (one id in messages from before batching)."""
    ids = [unit_ids] if isinstance(unit_ids, int) else unit_ids
    return [UnitRef(kind, unit_id, group_pk, rollout_id) for unit_id in ids]


def run_units_task(task: Any, refs: list[UnitRef], queue: str) -> list[str]:
    """The body shared by the visit and snippet tasks: run the message's units together.

    The task's thread only waits; the units run as coroutines on the process's engine.
    """
    runtime = current_runtime()
    try:
        outcomes = runtime.pipeline.run_units(refs)
    except DBAPIError as exc:
        if not (exc.connection_invalidated or isinstance(exc, TRANSIENT_DB_ERRORS)):
            metrics.TASKS.labels(queue, "error").inc()
            raise
        metrics.TASKS.labels(queue, "retry").inc()
        countdown = min(2**task.request.retries, 30)
        log.warning("database unavailable; retrying units %s in %ss", [r.unit_id for r in refs], countdown)
        raise task.retry(exc=exc, countdown=countdown, max_retries=40) from exc
    stopped = [ref for ref, outcome in zip(refs, outcomes, strict=True) if outcome == "stopped"]
    if stopped:
        # Shutting down mid-chain: the units were handed back; queue them again now.
        runtime.dispatcher.dispatch(stopped)
    for outcome in outcomes:
        metrics.TASKS.labels(queue, outcome).inc()
    return list(outcomes)


def run_aggregation_task(task: Any, group_pk: int, queue: str) -> str:
    runtime = current_runtime()
    structlog.contextvars.bind_contextvars(group_pk=group_pk)
    try:
        runtime.pipeline.run_aggregation(group_pk)
    except TRANSIENT_DB_ERRORS as exc:
        metrics.TASKS.labels(queue, "retry").inc()
        raise task.retry(exc=exc, countdown=min(2**task.request.retries, 30), max_retries=40) from exc
    finally:
        structlog.contextvars.clear_contextvars()
    metrics.TASKS.labels(queue, "done").inc()
    return "done"
