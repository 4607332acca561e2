"""Audits as the API, the CLI and the workers see them: start, run, read.

Starting one checks the request (a configured judge, a scope this tenant has, done
groups in it), samples the groups and stores the audit queued; the dispatcher runs it
where audits run (the ``audit`` queue's workers, or this process in embedded mode).
Running one claims it under a lease (renewed while it runs, so a lost worker's audit is
run again), re-scores the sampled groups with the audit judge on the process's engine,
pairs them with the stored originals and stores the audit's groups and its report in one
transaction. A judge that stays unreachable, or any other error, fails the audit with
the reason; the training groups are only ever read.
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
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from drcredit.audit.judges import AuditJudges
from drcredit.audit.labels.compare import human_report
from drcredit.audit.labels.queue import scoped_groups
from drcredit.audit.labels.store import group_originals, labels_of
from drcredit.audit.report import Compared, Side, build_report, with_bias
from drcredit.audit.rescore import Rescored, rescore
from drcredit.audit.sampling import groups_in_scope, sample
from drcredit.audit.schemas import HUMAN, AuditRequest
from drcredit.domain.advantages import group_advantages
from drcredit.domain.credit import group_credits
from drcredit.domain.errors import FieldError, InvalidInput
from drcredit.domain.group import GroupContent
from drcredit.scoring.engine import Engine
from drcredit.scoring.errors import NotFound, NotReady
from drcredit.scoring.intake.content import outlined_content, params_of
from drcredit.scoring.results.aggregation import judgments_of
from drcredit.scoring.results.outcomes import group_breakdowns
from drcredit.storage import models as m
from drcredit.storage import repository as repo
from drcredit.storage.database import Database
from drcredit.tenancy.owner import CALL_OWNER, Owner

log = logging.getLogger("drcredit.audit")

#: How long a running audit's claim holds without renewal (renewed every quarter of it).
LEASE_S = 60.0
#: How often a running audit looks whether its process is stopping.
STOP_POLL_S = 0.2


def start(
    db: Database, judges: AuditJudges, tenant: str, request: AuditRequest, dispatch: Callable[[int], None]
) -> dict[str, Any]:
    """Check, sample and store a new audit; ``dispatch(audit_pk)`` starts it. An audit
    against people's labels makes no judge call: it is compared and stored done here."""
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
        )
        s.add(audit)
        s.flush()
        audit_pk, doc = audit.id, summary(audit)
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
        message = f"audit {row.audit_id!r} is {row.status}" + (f": {row.error}" if row.error else "")
        raise NotReady(row.status, message)
    report = dict(row.report or {})
    if "agreement" in report:
        report["agreement"] = with_bias(report["agreement"])
    # An audit against people has its labelers; a judge audit none.
    return {**summary(row), "labelers": None, **report}


def summary(row: m.Audit) -> dict[str, Any]:
    """What is known of an audit at any status (its listing entry)."""
    return {
        "audit_id": row.audit_id,
        "status": row.status,
        "judge": row.judge,
        "judge_model": row.judge_model,
        "scope": row.scope,
        "sample_groups": row.sample_groups,
        "seed": row.seed,
        "group_ids": list(row.group_ids),
        "error": row.error,
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


def claim(db: Database, audit_pk: int, owner: str) -> bool:
    """Take the audit to run it (queued, or running under a lease that ran out)."""
    now = datetime.now(UTC)
    with db.session() as s:
        result = s.execute(
            update(m.Audit)
            .where(
                m.Audit.id == audit_pk,
                (m.Audit.status == "queued") | ((m.Audit.status == "running") & (m.Audit.lease_expires_at < now)),
            )
            .values(
                status="running",
                lease_owner=owner,
                lease_expires_at=now + timedelta(seconds=LEASE_S),
                started_at=now,
            )
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def run(db: Database, engine: Engine, judges: AuditJudges, audit_pk: int, stop: threading.Event | None = None) -> str:
    """Run a claimed-or-claimable audit to its end; its final status, or ``stopped`` when
    its process stops first (``stop`` set, or the engine closed under it): its claim is
    given back, and the next start (embedded) or sweep (workers) runs it again from the
    start, rather than it holding the process's shutdown or failing."""
    owner = f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"
    if not claim(db, audit_pk, owner):
        return "taken"
    started = time.monotonic()
    try:
        with db.session() as s:
            row = s.get(m.Audit, audit_pk)
            assert row is not None
            name, tenant, group_ids = row.judge, row.tenant, list(row.group_ids)
            row_scope = row.scope
            loaded = [_load(s, tenant, gid) for gid in group_ids]
        judge = judges.get(name)

        async def all_groups() -> list[Rescored]:
            import asyncio

            # Its calls wait below the tenant's training calls in the fleet's fair order.
            CALL_OWNER.set(Owner(tenant, str((row_scope or {}).get("run") or ""), audit=True))
            return list(
                await asyncio.gather(
                    *(rescore(judge, engine.judge_slots, content, params) for _, content, params, _ in loaded)
                )
            )

        future = engine.submit(all_groups())
        renew_at = time.monotonic() + LEASE_S / 4
        while True:
            try:
                results = future.result(timeout=STOP_POLL_S if stop is not None else LEASE_S / 4)
                break
            except FutureTimeout:
                if stop is not None and stop.is_set():
                    future.cancel()
                    return _stopped(db, audit_pk, owner)
                if time.monotonic() >= renew_at:
                    _renew(db, audit_pk, owner)
                    renew_at = time.monotonic() + LEASE_S / 4
            except FutureCancelled:  # the engine closed with the audit's calls on it
                return _stopped(db, audit_pk, owner)
        seconds = time.monotonic() - started
        compared, stored = _compare(loaded, results)
        agreement, effect = build_report(compared)
        report = {"agreement": agreement, "effect": effect, "usage": _usage(results, seconds)}
        with db.session() as s:
            for group, *_ in loaded:
                s.add(m.AuditGroup(audit_pk=audit_pk, group_pk=group.id, **stored[group.id]))
            s.execute(
                update(m.Audit)
                .where(m.Audit.id == audit_pk, m.Audit.lease_owner == owner)
                .values(status="done", report=report, finished_at=datetime.now(UTC), lease_expires_at=None)
            )
        return "done"
    except Exception as exc:  # noqa: BLE001 - whatever stops an audit fails it, with the reason
        reason = f"{type(exc).__name__}: {exc}" if not str(exc).startswith("judge ") else str(exc)
        log.warning("audit %s failed: %s", audit_pk, reason)
        with db.session() as s:
            s.execute(
                update(m.Audit)
                .where(m.Audit.id == audit_pk)
                .values(status="failed", error=reason, finished_at=datetime.now(UTC), lease_expires_at=None)
            )
        return "failed"


def _stopped(db: Database, audit_pk: int, owner: str) -> str:
    """Give the claim back: the audit stays running, its lease out, for the next start."""
    with db.session() as s:
        s.execute(
            update(m.Audit)
            .where(m.Audit.id == audit_pk, m.Audit.lease_owner == owner)
            .values(lease_expires_at=datetime.now(UTC))
        )
    log.info("audit %s stopped with its process; the next start or sweep runs it again", audit_pk)
    return "stopped"


def _renew(db: Database, audit_pk: int, owner: str) -> None:
    with db.session() as s:
        s.execute(
            update(m.Audit)
            .where(m.Audit.id == audit_pk, m.Audit.lease_owner == owner)
            .values(lease_expires_at=datetime.now(UTC) + timedelta(seconds=LEASE_S))
        )


Loaded = tuple[m.Group, GroupContent, Any, Side]


def _load(s: Session, tenant: str, group_id: str) -> Loaded:
    """A sampled group: its row, full content, parameters and the original judge's side."""
    group = s.scalar(select(m.Group).where(m.Group.tenant == tenant, m.Group.group_id == group_id))
    if group is None or group.status != "done":
        raise NotFound(f"group {group_id!r} is no longer a done group of this tenant")
    params = params_of(group)
    ids = list(
        s.scalars(select(m.Rollout.rollout_id).where(m.Rollout.group_pk == group.id).order_by(m.Rollout.position))
    )
    documents = repo.rollout_documents(s, group.id, ids)
    content = GroupContent.model_validate(
        {
            "question": group.question,
            "rubrics": group.rubrics,
            "rollouts": [documents[rid]["rollouts"][0] for rid in ids],
        }
    )
    outline = outlined_content(s, group)
    credits = group_credits(outline, judgments_of(s, group.id), params)
    rewards: dict[str, float | None] = {r.id: r.outcome_reward for r in outline.rollouts}
    if params.outcome_source == "judge":
        rewards = {rid: b.reward for rid, b in group_breakdowns(s, group.id, outline.rubrics, params).items()}
        outline = outline.model_copy(
            update={"rollouts": [r.model_copy(update={"outcome_reward": rewards.get(r.id)}) for r in outline.rollouts]}
        )
    judged: dict[tuple[str, str, int, str], tuple[str, int | None, frozenset[str], int]] = {}
    rows = s.execute(
        select(
            m.Judgment.kind,
            m.Judgment.rollout_id,
            m.Judgment.turn_index,
            m.Judgment.rubric_id,
            m.Judgment.status,
            m.Judgment.level,
            m.Judgment.match_count,
            m.Judgment.matches,
            m.Judgment.prior_support,
        ).where(m.Judgment.group_pk == group.id)
    )
    for kind, rollout_id, turn, key, status, level, count, matches, prior in rows:
        matched = frozenset(x["rubric_id"] for x in matches or ())
        value = count if kind == "snippet" else level
        judged[(kind, rollout_id, turn, key)] = (status, value, matched, prior or 0)
    side = Side(judged, group_advantages(outline, credits, params), rewards, params.history)
    return group, content, params, side


def _compare(loaded: list[Loaded], results: list[Rescored]) -> tuple[list[Compared], dict[int, dict[str, Any]]]:
    compared = []
    stored: dict[int, dict[str, Any]] = {}
    for (group, content, params, original), result in zip(loaded, results, strict=True):
        judged = {
            (j.kind, j.rollout_id, j.turn_index, j.key): (j.status, j.value, frozenset(j.matched), j.history)
            for j in result.judgments
        }
        audit = Side(judged, result.advantages, result.rewards, params.history)
        positive = [r.id for r in content.positive_rubrics]
        compared.append(Compared(group.group_id, original, audit, positive, params.outcome_source == "judge"))
        stored[group.id] = {
            "judgments": [j.as_json() for j in result.judgments],
            "advantages": _advantages_json(result),
            "usage": _usage([result], None),
        }
    return compared, stored


def _advantages_json(result: Rescored) -> dict[str, Any]:
    return {
        "rollouts": [
            {
                "id": r.rollout_id,
                "outcome_reward": result.rewards.get(r.rollout_id),
                "outcome_advantage": r.outcome_advantage,
                "turns": [
                    {
                        "index": t.index,
                        "credit": t.credit,
                        "process_advantage": t.process_advantage,
                        "advantage": t.advantage,
                    }
                    for t in r.turns
                ],
            }
            for r in result.advantages.rollouts
        ]
    }


def _usage(results: list[Rescored], seconds: float | None) -> dict[str, Any]:
    attempts = [a for r in results for j in r.judgments for a in j.attempts]
    usage: dict[str, Any] = {
        "calls": len(attempts),
        "judgments": sum(1 for r in results for j in r.judgments if not j.reused),
        "prompt_tokens": sum(int(a.get("prompt_tokens") or 0) for a in attempts),
        "completion_tokens": sum(int(a.get("completion_tokens") or 0) for a in attempts),
        "cached_prompt_tokens": sum(int(a.get("cached_tokens") or 0) for a in attempts),
    }
    if seconds is not None:
        usage["seconds"] = round(seconds, 3)
    return usage


def sweep(db: Database, dispatch: Callable[[int], None], stale_after_s: float) -> int:
    """Dispatch again the audits whose message or worker was lost: queued for longer
    than ``stale_after_s``, or running under a lease that ran out."""
    now = datetime.now(UTC)
    with db.session() as s:
        ids = list(
            s.scalars(
                select(m.Audit.id).where(
                    ((m.Audit.status == "queued") & (m.Audit.created_at < now - timedelta(seconds=stale_after_s)))
                    | ((m.Audit.status == "running") & (m.Audit.lease_expires_at < now))
                )
            )
        )
    for audit_pk in ids:
        dispatch(audit_pk)
    return len(ids)
