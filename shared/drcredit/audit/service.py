"""Audits as the API, the CLI and the workers see them: start, run, read.

Starting one checks the request (a configured judge, a scope this tenant has, done
groups in it), samples the groups and stores the audit queued; the dispatcher runs it
where audits run (the ``audit`` queue's workers, or this process in embedded mode). One
started past its tenant's budget with ``on_budget: wait`` is stored held: it is sent at
the budget's reset (:mod:`drcredit.tenancy.budgets`), not before.

Running one claims it under a lease (renewed while it runs, so a lost worker's audit is
run again: :mod:`.leases`), re-scores the sampled groups with the audit judge on the
process's engine, pairs them with the stored originals (:mod:`.pairing`) and stores the
audit's groups and its report in one transaction. Its judge usage is added to the
tenant's ledger as its calls come back (:mod:`.spend`; it counts in the budgets like a
group's). A judge that stays unreachable, or any other error, fails the audit
with the reason; the training groups are only ever read.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from drcredit.audit.judges import AuditJudges
from drcredit.audit.labels.compare import human_report
from drcredit.audit.labels.queue import scoped_groups
from drcredit.audit.labels.store import group_originals, labels_of
from drcredit.audit.leases import claim, give_back
from drcredit.audit.pairing import compare, load_group, usage_json
from drcredit.audit.report import build_report, with_bias
from drcredit.audit.rescore import Rescored, rescore
from drcredit.audit.sampling import groups_in_scope, sample
from drcredit.audit.schemas import HUMAN, AuditRequest
from drcredit.audit.spend import COUNT_EVERY_S, AuditSpend, count
from drcredit.domain.errors import FieldError, InvalidInput
from drcredit.domain.usage import Usage
from drcredit.scoring.engine import Engine
from drcredit.scoring.errors import NotFound, NotReady
from drcredit.scoring.intake.content import params_of
from drcredit.scoring.intake.ingest import Hold
from drcredit.scoring.results.usage import add_tenant_usage
from drcredit.storage import models as m
from drcredit.storage.database import Database, rows_changed
from drcredit.tenancy.owner import CALL_OWNER, Owner
from drcredit.tenancy.windows import bucket, held_for_budget

log = logging.getLogger("drcredit.audit")

#: How often a running audit looks whether its process is stopping.
STOP_POLL_S = 0.2


def start(
    db: Database,
    judges: AuditJudges,
    tenant: str,
    request: AuditRequest,
    dispatch: Callable[[int], None],
    hold: Hold | None = None,
) -> dict[str, Any]:
    """Check, sample and store a new audit; ``dispatch(audit_pk)`` starts it, unless
    ``hold`` (its tenant's budget is used up): then the budget's release sends it. An
    audit against people's labels makes no judge call: it is compared and stored done here."""
    if request.judge == HUMAN:
        return start_human(db, tenant, request)
    if request.judge not in judges.names:
        known = ", ".join(judges.names) or "none is configured (DRCREDIT_AUDIT_JUDGES)"
        raise InvalidInput([FieldError("judge", f"no audit judge named {request.judge!r} (known: {known})")])
    with db.session() as s:
        in_scope = groups_in_scope(s, tenant, request.scope)
        if not in_scope:
            raise InvalidInput([FieldError("scope", "no group in this scope is done yet")])
        chosen = sample(in_scope, request.sample_groups, request.seed)
        audit = m.Audit(
            audit_id=f"aud-{uuid.uuid4().hex[:16]}",
            tenant=tenant,
            judge=request.judge,
            judge_model=judges.model_of(request.judge),
            scope=request.scope.model_dump(exclude_none=True),
            sample_groups=request.sample_groups,
            seed=request.seed,
            status="queued",
            group_ids=chosen,
            held_until=hold.until if hold else None,
            held_for=hold.budget if hold else None,
        )
        s.add(audit)
        s.flush()
        audit_pk, doc = audit.id, summary(audit)
    if hold is None:
        dispatch(audit_pk)
    return doc


def start_human(db: Database, tenant: str, request: AuditRequest) -> dict[str, Any]:
    """The original judgments against the labels of the scope's labeled done groups."""
    started = time.monotonic()
    with db.session() as s:
        groups = scoped_groups(s, tenant, request.scope, prefix="scope.")
        labels = labels_of(s, tenant, [g.id for g in groups], request.labelers)
        named = {name for keys in labels.values() for values in keys.values() for name in values}
        missing = [
            FieldError(f"labelers[{i}]", f"no label by {name!r} in this scope")
            for i, name in enumerate(request.labelers or ())
            if name not in named
        ]
        if missing:
            raise InvalidInput(missing)
        labeled = {g.group_id: g for g in groups if labels.get(g.id)}
        if not labeled:
            raise InvalidInput([FieldError("scope", "no done group in this scope has a label")])
        chosen = sample(list(labeled), request.sample_groups, request.seed)
        compared = [
            (group_originals(s, labeled[gid]), labels[labeled[gid].id], params_of(labeled[gid]).history)
            for gid in chosen
        ]
        report = human_report(compared)
        labels_used = sum(len(v) for _, keys, _ in compared for v in keys.values())
        now = datetime.now(UTC)
        report.update(
            effect=None,
            usage={"calls": 0, "labels": labels_used, "seconds": round(time.monotonic() - started, 3)},
        )
        audit = m.Audit(
            audit_id=f"aud-{uuid.uuid4().hex[:16]}",
            tenant=tenant,
            judge=HUMAN,
            judge_model=None,
            scope=request.scope.model_dump(exclude_none=True),
            sample_groups=request.sample_groups,
            seed=request.seed,
            status="done",
            group_ids=chosen,
            report=report,
            started_at=now,
            finished_at=now,
        )
        s.add(audit)
        s.flush()
        return summary(audit)


def find(s: Session, tenant: str, audit_id: str) -> m.Audit:
    row = s.scalar(select(m.Audit).where(m.Audit.tenant == tenant, m.Audit.audit_id == audit_id))
    if row is None:
        raise NotFound(f"audit {audit_id!r} not found", "audit_id")
    return row


def document(row: m.Audit) -> dict[str, Any]:
    """The audit's document: ``409`` (NotReady) with its status until it is done."""
    if row.status != "done":
        status = shown_status(row)
        message = f"audit {row.audit_id!r} is {status}" + (f": {row.error}" if row.error else "")
        if held_for_budget(row.status, row.held_until) and row.held_until is not None:
            message += (
                f": its tenant's {row.held_for} is used up; it runs when it resets at {row.held_until.isoformat()}"
            )
        raise NotReady(status, message)
    report = dict(row.report or {})
    if "agreement" in report:
        report["agreement"] = with_bias(report["agreement"])
    # An audit against people has its labelers; a judge audit none.
    return {**summary(row), "labelers": None, **report}


def shown_status(row: m.Audit) -> str:
    """The status a client is told: a held audit is ``waiting_for_budget``."""
    return "waiting_for_budget" if held_for_budget(row.status, row.held_until) else row.status


def summary(row: m.Audit) -> dict[str, Any]:
    """What is known of an audit at any status (its listing entry)."""
    held_until = row.held_until if held_for_budget(row.status, row.held_until) else None
    return {
        "audit_id": row.audit_id,
        "status": shown_status(row),
        "judge": row.judge,
        "judge_model": row.judge_model,
        "scope": row.scope,
        "sample_groups": row.sample_groups,
        "seed": row.seed,
        "group_ids": list(row.group_ids),
        "error": row.error,
        # Accepted past its tenant's budget (on_budget: wait): it runs at the reset.
        "waiting_for_budget": {"budget": row.held_for, "resets_at": _iso(held_until)} if held_until else None,
        "created_at": _iso(row.created_at),
        "started_at": _iso(row.started_at),
        "finished_at": _iso(row.finished_at),
    }


def listing(s: Session, tenant: str, run: str | None = None) -> list[dict[str, Any]]:
    """A tenant's audits, newest first (``run``: those over that run), each with its
    headline figures once done."""
    query = select(m.Audit).where(m.Audit.tenant == tenant).order_by(m.Audit.created_at.desc(), m.Audit.id.desc())
    out = []
    for row in s.scalars(query):
        if run is not None and (row.scope or {}).get("run") != run and not _covers_run(s, tenant, row, run):
            continue
        entry = summary(row)
        if row.status == "done" and row.report:
            entry["agreement"] = with_bias(row.report.get("agreement") or {})
            effect = row.report.get("effect")
            entry["effect"] = None if effect is None else {k: v for k, v in effect.items() if k != "groups"}
            entry["usage"] = row.report.get("usage")
        out.append(entry)
    return out


def _covers_run(s: Session, tenant: str, row: m.Audit, run: str) -> bool:
    if not row.group_ids:
        return False
    found = s.scalar(
        select(m.Group.id).where(m.Group.tenant == tenant, m.Group.run == run, m.Group.group_id.in_(row.group_ids))
    )
    return found is not None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


# ----------------------------------------------------------------------------- running


def run(
    db: Database,
    engine: Engine,
    judges: AuditJudges,
    audit_pk: int,
    stop: threading.Event | None = None,
    budget_window_s: float | None = None,
) -> str:
    """Run a claimed-or-claimable audit to its end; its final status, or ``stopped`` when
    its process stops first (``stop`` set, or the engine closed under it): its claim is
    given back, and the next start (embedded) or sweep (workers) runs it again from the
    start, rather than it holding the process's shutdown or failing.

    Its judge usage is added to the tenant's ledger as its calls come back
    (:mod:`.spend`: every :data:`~.spend.COUNT_EVERY_S`, with the lease's renewal, at the
    bucket of then; test windows: ``budget_window_s``) and the rest in the transaction
    that ends it, so each call counts once. A stopped, lost or failed run's calls count
    too: they were made."""
    owner = f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"
    if not claim(db, audit_pk, owner):
        return "taken"
    started = time.monotonic()
    tenant = ""
    spend = AuditSpend()
    counted = Usage()

    def count_spend() -> None:
        """Count what was spent since the last count, and renew the lease (nothing is
        counted once the lease is no longer this run's: the run that holds it counts)."""
        nonlocal counted
        total = spend.total()
        if count(db, audit_pk, owner, tenant, total - counted, budget_window_s):
            counted = total

    try:
        with db.session() as s:
            row = s.get(m.Audit, audit_pk)
            assert row is not None
            name, tenant, group_ids = row.judge, row.tenant, list(row.group_ids)
            row_scope = row.scope
            loaded = [load_group(s, tenant, gid) for gid in group_ids]
        judge = judges.get(name)

        async def all_groups() -> list[Rescored]:
            import asyncio

            # Its calls wait below the tenant's training calls in the fleet's fair order.
            CALL_OWNER.set(Owner(tenant, str((row_scope or {}).get("run") or ""), audit=True))
            return list(
                await asyncio.gather(
                    *(rescore(judge, engine.judge_slots, content, params, spend) for _, content, params, _ in loaded)
                )
            )

        future = engine.submit(all_groups())
        count_at = time.monotonic() + COUNT_EVERY_S
        while True:
            try:
                results = future.result(timeout=STOP_POLL_S if stop is not None else COUNT_EVERY_S)
                break
            except FutureTimeout:
                if stop is not None and stop.is_set():
                    future.cancel()
                    count_spend()
                    return give_back(db, audit_pk, owner)
                if time.monotonic() >= count_at:
                    count_spend()
                    count_at = time.monotonic() + COUNT_EVERY_S
            except FutureCancelled:  # the engine closed with the audit's calls on it
                count_spend()
                return give_back(db, audit_pk, owner)
        seconds = time.monotonic() - started
        compared, stored = compare(loaded, results)
        agreement, effect = build_report(compared)
        report = {"agreement": agreement, "effect": effect, "usage": usage_json(results, seconds)}
        with db.session() as s:
            for group, *_ in loaded:
                s.add(m.AuditGroup(audit_pk=audit_pk, group_pk=group.id, **stored[group.id]))
            now = datetime.now(UTC)
            done = update(m.Audit).where(m.Audit.id == audit_pk, m.Audit.lease_owner == owner)
            if rows_changed(s, done.values(status="done", report=report, finished_at=now, lease_expires_at=None)):
                add_tenant_usage(s, tenant, bucket(now, budget_window_s), spend.total() - counted)
        return "done"
    except Exception as exc:  # noqa: BLE001 - whatever stops an audit fails it, with the reason
        reason = f"{type(exc).__name__}: {exc}" if not str(exc).startswith("judge ") else str(exc)
        log.warning("audit %s failed: %s", audit_pk, reason)
        with db.session() as s:
            now = datetime.now(UTC)
            failed = update(m.Audit).values(status="failed", error=reason, finished_at=now, lease_expires_at=None)
            # Still this run's: the calls it made and has not counted yet count, once.
            if rows_changed(s, failed.where(m.Audit.id == audit_pk, m.Audit.lease_owner == owner)):
                add_tenant_usage(s, tenant, bucket(now, budget_window_s), spend.total() - counted)
            else:
                s.execute(failed.where(m.Audit.id == audit_pk))
        return "failed"
