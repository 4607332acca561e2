"""The audit task: one audit, from its claim to its report (idempotent: a running audit
is taken by one delivery; a lost one is run again by the sweeper)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from drcredit import metrics
from drcredit.audit import service
from drcredit.broker.queues import AUDITOR, RUN_AUDIT
from drcredit.wiring.worker import current_runtime


@shared_task(name=RUN_AUDIT, bind=True)
def run_audit(self: Any, audit_pk: int) -> str:
    runtime = current_runtime()
    outcome = service.run(
        runtime.db, runtime.pipeline.engine, runtime.audits, audit_pk, budget_window_s=runtime.settings.budget_window_s
    )
    metrics.TASKS.labels(AUDITOR, outcome).inc()
    return outcome
