"""The snippet task: match a search turn's unvisited snippets against the rubrics."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from drcredit.broker.queues import MATCH_SNIPPETS, SNIPPET_MATCHER
from drcredit.broker.worker import run_unit_task
from drcredit.scoring.dispatch import UnitRef


@shared_task(name=MATCH_SNIPPETS, bind=True, max_retries=40)
def match_snippets(self: Any, unit_id: int, group_pk: int) -> str:
    return run_unit_task(self, UnitRef("snippet", unit_id, group_pk), SNIPPET_MATCHER)
