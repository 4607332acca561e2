"""The visit-chain task: a group's (rollout, positive rubric) chains (up to 64), each judging its visits in order."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from drcredit.broker.queues import RUN_VISIT_CHAIN, VISIT_JUDGE
from drcredit.wiring.worker import run_units_task, unit_refs


@shared_task(name=RUN_VISIT_CHAIN, bind=True, max_retries=40)
def run_chain(self: Any, unit_ids: int | list[int], group_pk: int, rollout_id: str = "") -> list[str]:
    """Continue each chain from its last stored judgment; store each judgment before the next call."""
    return run_units_task(self, unit_refs("visit_chain", unit_ids, group_pk, rollout_id), VISIT_JUDGE)
