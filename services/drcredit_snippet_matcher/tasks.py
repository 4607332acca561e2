"""The snippet task: match search turns' unvisited snippets against the rubrics."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from drcredit.broker.queues import MATCH_SNIPPETS, SNIPPET_MATCHER
from drcredit.wiring.worker import run_units_task, unit_refs


@shared_task(name=MATCH_SNIPPETS, bind=True, max_retries=40)
def match_snippets(self: Any, unit_ids: int | list[int], group_pk: int, rollout_id: str = "") -> list[str]:
    return run_units_task(self, unit_refs("snippet", unit_ids, group_pk, rollout_id), SNIPPET_MATCHER)
