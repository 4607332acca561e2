"""The aggregation task, enqueued once per group by the unit that finishes last."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from drcredit.broker.queues import AGGREGATE_GROUP, CREDIT_AGGREGATOR
from drcredit.wiring.worker import run_aggregation_task


@shared_task(name=AGGREGATE_GROUP, bind=True, max_retries=40)
def aggregate_group(self: Any, group_pk: int) -> str:
    """Compute and store the group's credits and advantages (idempotent)."""
    return run_aggregation_task(self, group_pk, CREDIT_AGGREGATOR)
