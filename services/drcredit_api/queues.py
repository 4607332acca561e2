"""The broker's queues as the API sees them: which have no live consumer, what waits on
them, and their part of the group status, ``/readyz`` and ``/metrics``.

A queue that no worker consumes is otherwise silent: its messages wait in Redis and its
groups stay ``running``. The workers say which queues they consume
(:mod:`drcredit.broker.consumers`); everything here is blocking (Redis and database
reads) and runs on a worker thread. In embedded mode (no broker) there is no census and
every function answers "nothing to say".
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request

from drcredit import metrics
from drcredit.broker import waits
from drcredit.broker.queues import ALL_QUEUES
from drcredit.broker.waits import IdleQueues
from drcredit.scoring.errors import NotReady
from drcredit.scoring.results import documents
from drcredit.storage.database import aware
from drcredit.tenancy.windows import held_for_budget
from drcredit.wiring.runtime import Runtime

log = logging.getLogger("drcredit.api")

OPEN = ("queued", "running")


def idle_queues(request: Request) -> IdleQueues | None:
    """The queues no live worker consumes, each with when its last consumer was seen (a
    census at most a second old); None in embedded mode or while Redis cannot be read."""
    census = getattr(request.app.state, "consumers", None)
    if census is None:
        return None
    try:
        idle: IdleQueues = census.get().without_consumer()
        return idle
    except Exception:  # informative only; /readyz reports the broker itself
        log.debug("could not read the consumer records", exc_info=True)
        return None


def status_document(s: Any, group: Any, idle: IdleQueues | None, price: Any = None) -> dict[str, Any]:
    """The group's status (docs/api.md), with its usage at ``price`` and its waits on
    queues without a consumer."""
    waiting = None
    if idle and group.status in OPEN:
        waiting = waits.consumer_waits(s, [group.id], idle).get(group.id)
    return documents.status_document(s, group, price, waiting)


def require_done(s: Any, row: Any, request: Request) -> None:
    """``409`` unless the group is done; while its work waits on a queue without a
    consumer, the answer says which queue and how to end the wait."""
    if held_for_budget(row.status, row.held_until):
        raise NotReady(
            "waiting_for_budget",
            f"group {row.group_id!r} is waiting_for_budget: its tenant's {row.held_for} is used up;"
            f" judging starts when it resets at {aware(row.held_until).isoformat()}",
        )
    if row.status in OPEN:
        idle = idle_queues(request)
        waiting = waits.consumer_waits(s, [row.id], idle).get(row.id) if idle else None
        if waiting:
            raise NotReady(row.status, f"group {row.group_id!r} is {row.status}: {waits.describe(waiting)}")
    documents.require_status_done(row.group_id, row.status, row.error)


def readiness(request: Request, rt: Runtime, database_ok: bool) -> dict[str, Any] | None:
    """The ``queues`` part of ``/readyz`` (docs/api.md): every queue's live consumers and
    messages, the queues without a consumer and the open groups waiting on each, and the
    live workers. Informative: a queue without a consumer does not make the API unready
    (it can still take groups; they wait). None in embedded mode."""
    census = getattr(request.app.state, "consumers", None)
    if census is None:
        return None
    try:
        current = census.get()
    except Exception as exc:  # noqa: BLE001 - the broker check says the rest
        return {"error": f"cannot read the consumer records: {type(exc).__name__}"}
    document: dict[str, Any] = current.document()
    idle = current.without_consumer()
    waiting: dict[str, int] | None = None
    if database_ok and not rt.schema_problem:
        try:
            with rt.db.read_session() as s:
                waiting = waits.groups_waiting(s, idle)
        except Exception:  # informative only
            log.debug("could not count the groups waiting for a consumer", exc_info=True)
    document["groups_waiting_for_consumer"] = waiting
    return document


def update_metrics(request: Request, rt: Runtime) -> None:
    """Set the queue gauges before a scrape: messages, live consumers, groups waiting for a
    consumer (0 on every queue that has one). Left as they were when Redis or the
    database cannot be read."""
    census = getattr(request.app.state, "consumers", None)
    if census is None:
        return
    try:
        current = census.get()
    except Exception:  # noqa: BLE001 - metrics must answer anyway
        return
    for queue in ALL_QUEUES:
        metrics.QUEUE_DEPTH.labels(queue).set(current.messages.get(queue, 0))
        metrics.QUEUE_CONSUMERS.labels(queue).set(current.count(queue))
    try:
        with rt.db.read_session() as s:
            waiting = waits.groups_waiting(s, current.without_consumer())
    except Exception:  # noqa: BLE001
        return
    for queue in ALL_QUEUES:
        metrics.GROUPS_WAITING_FOR_CONSUMER.labels(queue).set(waiting.get(queue, 0))
