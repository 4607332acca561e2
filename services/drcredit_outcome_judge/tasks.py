"""The outcome task: the reports of one message's rollouts, each judged against its rubrics and citations."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from drcredit.broker.queues import JUDGE_OUTCOME, OUTCOME_JUDGE
from drcredit.wiring.worker import run_units_task, unit_refs


@shared_task(name=JUDGE_OUTCOME, bind=True, max_retries=40)
def judge_outcome(self: Any, unit_ids: int | list[int], group_pk: int, rollout_id: str = "") -> list[str]:
    """Judge each report's rubric satisfaction and citation support; store every judgment."""
    return run_units_task(self, unit_refs("outcome", unit_ids, group_pk, rollout_id), OUTCOME_JUDGE)
