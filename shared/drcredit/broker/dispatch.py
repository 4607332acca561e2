"""Dispatch work units as Celery tasks, sent by name to their service's queue."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from celery import Celery

from drcredit.broker.queues import AGGREGATE_GROUP, RUN_AUDIT, TASK_QUEUES, UNIT_TASKS
from drcredit.scoring.dispatch import UnitRef, unit_batches

log = logging.getLogger("drcredit.broker")


class CeleryDispatcher:
    """Sends tasks; a send that fails (broker down) is logged, not raised.

    The unit stays queued in the database and the workers' sweeper sends it again, so
    an ingest never fails, and nothing is lost, because the broker blinked.
    """

    def __init__(self, app: Celery):
        self.app = app

    def dispatch(self, units: Sequence[UnitRef]) -> None:
        for batch in unit_batches(units):
            first = batch[0]
            name = UNIT_TASKS[first.kind]
            rollouts = {u.rollout_id for u in batch}
            self._send(name, [u.unit_id for u in batch], first.group_pk, first.rollout_id if len(rollouts) == 1 else "")

    def dispatch_aggregation(self, group_pk: int) -> None:
        self._send(AGGREGATE_GROUP, group_pk)

    def dispatch_audit(self, audit_pk: int) -> None:
        self._send(RUN_AUDIT, audit_pk)

    def _send(self, name: str, *args: Any) -> None:
        try:
            self.app.send_task(
                name,
                args=list(args),
                queue=TASK_QUEUES[name],
                retry=True,
                retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5},
            )
        except Exception:
            log.warning("could not send %s%s; the sweeper will resend it", name, args, exc_info=True)

    def queue_depths(self) -> dict[str, int]:
        """Messages waiting in each queue (Redis lists named like the queues)."""
        with self.app.connection_for_read() as conn:
            client = conn.default_channel.client
            return {queue: int(client.llen(queue)) for queue in set(TASK_QUEUES.values())}

    def ping(self) -> None:
        with self.app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            conn.default_channel.client.ping()
