"""The visit-chain task: one per (rollout, positive rubric), judging its visits in order."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from drcredit.broker.queues import RUN_VISIT_CHAIN, VISIT_JUDGE
from drcredit.broker.worker import run_unit_task
from drcredit.scoring.dispatch import UnitRef


@shared_task(name=RUN_VISIT_CHAIN, bind=True, max_retries=40)
def run_chain(self: Any, unit_id: int, group_pk: int) -> str:
    """Continue the chain from its last stored judgment; commit each before the next call."""
    return run_unit_task(self, UnitRef("visit_chain", unit_id, group_pk), VISIT_JUDGE)
