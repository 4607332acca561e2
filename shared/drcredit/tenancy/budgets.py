"""Budgets at the door: a tenant's usage in its windows, the check before new work,
and the release of groups and judge audits held for a reset.

Usage is read from the database, so every API process agrees: the ledger of finished
groups and ended judge audits (:func:`drcredit.scoring.results.usage.tenant_usage`) plus
the judgments of the tenant's open groups, in one statement. A check runs before new
groups or judge audits are stored (``POST /v1/groups``, ``/v1/batches``,
``/v1/audits``): past a budget they are refused (:class:`BudgetExhausted`, a 429) or,
with ``on_budget: wait``, stored with a :class:`~drcredit.scoring.intake.ingest.Hold`
until the budget resets. Work already admitted is never stopped: a group's own rollouts
are always taken, and its judging (or an audit's) always finishes, so a budget may be
passed by what was admitted before it was reached.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from drcredit import metrics
from drcredit.domain.usage import JudgePrice, Usage
from drcredit.scoring.dispatch import Dispatcher
from drcredit.scoring.intake.ingest import Hold
from drcredit.scoring.results.usage import tenant_usage
from drcredit.scoring.work.lifecycle import aggregate_ready, dispatch_queued
from drcredit.storage import models as m
from drcredit.storage.database import Database
from drcredit.tenancy.policy import TenantPolicy, policy_of
from drcredit.tenancy.windows import WINDOWS, BudgetState, Window, blocking, bounds, states

log = logging.getLogger("drcredit.tenancy")

#: How often the API looks for held groups and audits whose budget has reset.
RELEASE_EVERY_S = 1.0


class BudgetExhausted(Exception):
    """New work of a tenant past one of its budgets (``on_budget: refuse``)."""

    def __init__(self, state: BudgetState, now: datetime):
        super().__init__(f"budget {state.budget} exhausted: used {state.used:g} of {state.limit:g}")
        self.state = state
        self.retry_after_s = max(1, int((state.resets_at - now).total_seconds() + 0.999))


@dataclass(frozen=True)
class TenantUsage:
    """A tenant's usage in its current day and month, and each of its budgets."""

    tenant: str
    usage: dict[Window, Usage]
    budgets: list[BudgetState]


def read_usage(
    s: Session,
    tenant: str,
    policy: TenantPolicy,
    price: JudgePrice | None,
    now: datetime,
    window_s: float | None = None,
) -> TenantUsage:
    usage = tenant_usage(s, tenant, {w: bounds(w, now, window_s) for w in WINDOWS})
    windows: dict[Window, Usage] = {w: usage[w] for w in WINDOWS}
    return TenantUsage(tenant, windows, states(policy, windows, price, now, window_s))


def admit(
    s: Session,
    tenant: str,
    policies: Mapping[str, TenantPolicy],
    price: JudgePrice | None,
    now: datetime,
    window_s: float | None = None,
) -> Hold | None:
    """May ``tenant`` start new work now? None: yes; a hold: store it, send it at the
    reset. Raises :class:`BudgetExhausted` when its policy refuses."""
    policy = policy_of(policies, tenant)
    if not policy.budget.limits():
        return None
    budgets = read_usage(s, tenant, policy, price, now, window_s).budgets
    export(tenant, budgets)
    spent = blocking(budgets)
    if spent is None:
        return None
    if policy.on_budget == "refuse":
        raise BudgetExhausted(spent, now)
    return Hold(spent.resets_at, spent.budget)


def export(tenant: str, budgets: list[BudgetState]) -> None:
    """Each budget's used part, for the metrics (1: spent)."""
    for b in budgets:
        metrics.TENANT_BUDGET_USED.labels(tenant, b.budget).set(b.used / b.limit if b.limit else 1.0)


def usage_document(report: TenantUsage, price: JudgePrice | None, share_last_minute: float | None) -> dict[str, Any]:
    """``GET /v1/usage``: usage per window, the share of the fleet, each budget."""
    return {
        "tenant": report.tenant,
        "day": report.usage["day"].document(price),
        "month": report.usage["month"].document(price),
        "share_last_minute": share_last_minute,
        "budgets": {
            b.budget: {
                "limit": b.limit,
                "used": b.used,
                "left": b.left,
                "used_ratio": (b.used / b.limit) if b.limit else 1.0,
                "resets_at": b.resets_at.isoformat(),
            }
            for b in report.budgets
        },
    }


def _unhold_due(db: Database, model: type[m.Group] | type[m.Audit], now: datetime, *where: Any) -> list[int]:
    """Unhold the rows of ``model`` whose reset has come; their ids, in order. The
    conditional update unholds each once, whichever API process gets there first."""
    due = (model.held_until.is_not(None), model.held_until <= now, *where)
    with db.read_session() as s:
        # A read first: on SQLite an update that finds nothing still takes the one writer's lock.
        if s.scalar(select(model.id).where(*due).limit(1)) is None:
            return []
    with db.session() as s:
        return sorted(s.scalars(update(model).where(*due).values(held_until=None, held_for=None).returning(model.id)))


def release_due(db: Database, dispatcher: Dispatcher, now: datetime) -> list[int]:
    """Send the work of held groups whose reset has come; their ids."""
    released = _unhold_due(db, m.Group, now)
    if released:
        dispatch_queued(db, dispatcher, released)
        aggregate_ready(db, dispatcher, released)
        log.info("released %d groups held for a budget", len(released))
    return released


def release_due_audits(db: Database, dispatcher: Dispatcher, now: datetime) -> list[int]:
    """Send the held judge audits whose reset has come, as their start would have; their
    ids. A send that is lost is sent again by the audit sweeper (the audit is then queued
    and no longer held)."""
    released = _unhold_due(db, m.Audit, now, m.Audit.status == "queued")
    for audit_pk in released:
        dispatcher.dispatch_audit(audit_pk)
    if released:
        log.info("released %d audits held for a budget", len(released))
    return released


class Releaser(threading.Thread):
    """Releases held groups and audits at their budget's reset (within :data:`RELEASE_EVERY_S`)."""

    def __init__(self, db: Database, dispatcher: Dispatcher, clock: Callable[[], datetime] = lambda: datetime.now(UTC)):
        super().__init__(name="drcredit-budget-release", daemon=True)
        self.db, self.dispatcher, self.clock = db, dispatcher, clock
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(RELEASE_EVERY_S):
            now = self.clock()
            try:
                release_due(self.db, self.dispatcher, now)
            except Exception:
                log.warning("could not release groups held for a budget", exc_info=True)
            try:
                release_due_audits(self.db, self.dispatcher, now)
            except Exception:
                log.warning("could not release audits held for a budget", exc_info=True)

    def stop(self) -> None:
        self.stopped.set()
