"""The JSON documents the API and CLI return: a group's status and its advantages.

The credits breakdown is :mod:`drcredit.scoring.results.breakdown`. Both carry the judge's usage
(:mod:`drcredit.scoring.results.usage`), its ``cost_usd`` at the price given (null without one).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Integer, func, select
from sqlalchemy.orm import Session, selectinload

from drcredit.domain.group import is_valid_group_id
from drcredit.domain.usage import JudgePrice, Usage, total
from drcredit.scoring.errors import NotFound, NotReady
from drcredit.scoring.results.usage import group_usage, rollout_usage
from drcredit.storage import models as m
from drcredit.storage.database import aware
from drcredit.tenancy.windows import held_for_budget


def _with_turns() -> Any:
    """Rollouts and their turns' results, never their posted bodies (megabytes of page text)."""
    return selectinload(m.Group.rollouts).selectinload(m.Rollout.turns).defer(m.Turn.body, raiseload=True)


def find_group(s: Session, tenant: str, group_id: str, *, full: bool = False) -> m.Group:
    """``full``: with rollouts and turns (their results, not their posted bodies).

    The documents read only the turns' results, and a step's turn bodies are megabytes
    of page text: they are never loaded here.
    """
    if not is_valid_group_id(group_id):  # never reaches the database (a NUL would fail there)
        raise NotFound(f"group {group_id!r} not found")
    query = select(m.Group).where(m.Group.tenant == tenant, m.Group.group_id == group_id)
    if full:
        query = query.options(_with_turns())
    row = s.scalar(query)
    if row is None:
        raise NotFound(f"group {group_id!r} not found")
    return row


def find_batch(s: Session, tenant: str, batch_id: str) -> m.Batch:
    if not is_valid_group_id(batch_id):
        raise NotFound(f"batch {batch_id!r} not found", "batch_id")
    row = s.scalar(select(m.Batch).where(m.Batch.tenant == tenant, m.Batch.batch_id == batch_id))
    if row is None:
        raise NotFound(f"batch {batch_id!r} not found", "batch_id")
    return row


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def progress(s: Session, group: m.Group) -> dict[str, int]:
    """Judgment counts: total excludes deterministic zeros, done includes skipped calls."""
    return progress_of(s, [group])[group.id]


def progress_of(s: Session, groups: Sequence[m.Group]) -> dict[int, dict[str, int]]:
    """:func:`progress` of many groups in two statements (a batch's document reads them all)."""
    pks = [g.id for g in groups]
    counts: dict[int, dict[str, int]] = {pk: {} for pk in pks}
    for group_pk, status, count in s.execute(
        select(m.Judgment.group_pk, m.Judgment.status, func.count())
        .where(m.Judgment.group_pk.in_(pks))
        .group_by(m.Judgment.group_pk, m.Judgment.status)
    ):
        counts[group_pk][status] = count
    calls: dict[int, tuple[int, int]] = {pk: (0, 0) for pk in pks}
    for group_pk, n, hits in s.execute(
        select(m.Judgment.group_pk, func.count(), func.coalesce(func.sum(m.Judgment.cache_hit.cast(Integer)), 0))
        .where(m.Judgment.group_pk.in_(pks), m.Judgment.status.in_(("ok", "failed")))
        .group_by(m.Judgment.group_pk)
    ):
        calls[group_pk] = (int(n), int(hits))
    out = {}
    for g in groups:
        c, (n, hits) = counts[g.id], calls[g.id]
        out[g.id] = {
            "judgments_total": g.judgments_planned,
            "judgments_done": c.get("ok", 0) + c.get("failed", 0) + c.get("skipped", 0),
            "judgments_failed": c.get("failed", 0),
            "judge_calls": n - hits,
            "cache_hits": hits,
            "deterministic_zeros": c.get("deterministic", 0),
            "snippet_calls_skipped": c.get("skipped", 0),
        }
    return out


def status_document(
    s: Session, group: m.Group, price: JudgePrice | None = None, waiting_for_consumer: list[Any] | None = None
) -> dict[str, Any]:
    """Status and progress, with the judge's usage so far. ``waiting_for_consumer``: the
    group's waits on queues no live worker consumes (:mod:`drcredit.broker.waits`;
    distributed mode only)."""
    held = held_for_budget(group.status, group.held_until)
    return {
        "group_id": group.group_id,
        # Accepted past its tenant's budget (on_budget: wait): nothing is sent before the reset.
        "status": "waiting_for_budget" if held else group.status,
        "batch_id": group.batch.batch_id if group.batch is not None else None,
        "error": group.error,
        "expected_rollouts": group.expected_rollouts,
        "rollouts_received": group.rollouts_received,
        "progress": progress(s, group),
        "usage": group_usage(s, [group.id])[group.id].document(price),
        "judge": {"backend": group.judge_backend, "model": group.judge_model},
        # Judgments of the group wait for a judge that cannot be reached (docs/method.md, "Judge failures").
        "waiting_for_judge": {"since": _iso(group.judge_waiting_since), "reason": group.judge_waiting_reason}
        if group.judge_waiting_since is not None and group.status in ("queued", "running")
        else None,
        # Work of the group waits on a queue that no live worker consumes (docs/operations.md).
        "waiting_for_consumer": waiting_for_consumer or None,
        "waiting_for_budget": {"budget": group.held_for, "resets_at": _iso(aware(group.held_until))}
        if held and group.held_until is not None
        else None,
        "metadata": group.metadata_,
        "created_at": _iso(group.created_at),
        "started_at": _iso(group.started_at),
        "finished_at": _iso(group.finished_at),
    }


def require_done(group: m.Group) -> None:
    require_status_done(group.group_id, group.status, group.error)


def require_status_done(group_id: str, status: str, error: str | None) -> None:
    """``409`` with the group's status (and error) unless it is done."""
    if status != "done":
        message = f"group {group_id!r} is {status}"
        if error:
            message += f": {error}"
        raise NotReady(status, message)


def advantages_documents(
    s: Session, tenant: str, group_ids: Sequence[str], price: JudgePrice | None = None
) -> dict[str, dict[str, Any]]:
    """The advantages documents of many done groups, read together (a batch's answer):
    one statement per table instead of a handful per group."""
    if not group_ids:
        return {}
    groups = list(
        s.scalars(
            select(m.Group).where(m.Group.tenant == tenant, m.Group.group_id.in_(group_ids)).options(_with_turns())
        )
    )
    for g in groups:
        require_done(g)
    counts = progress_of(s, groups)
    usage = rollout_usage(s, [g.id for g in groups])
    return {g.group_id: _advantages(g, g.status, g.stats or {}, counts[g.id], usage[g.id], price) for g in groups}


def advantages_document(s: Session, group: m.Group, price: JudgePrice | None = None) -> dict[str, Any]:
    """The advantages document (docs/api.md) for a done group, with its judgment counts
    and the judge's usage."""
    require_done(group)
    usage = rollout_usage(s, [group.id])[group.id]
    return _advantages(group, group.status, group.stats or {}, progress(s, group), usage, price)


def done_advantages_json(s: Session, group_pk: int, stats: dict[str, Any], price: JudgePrice | None = None) -> str:
    """The advantages document of a group being finished with ``stats``, as JSON text.

    Aggregation stores it with the results, in the transaction that makes the group
    done. Built from the rows just written (re-read, not ORM objects loaded before the
    writes) by the same code as :func:`advantages_document`, so it is exactly what a
    read of the done group's rows gives; :func:`final_advantages` serves it as stored.
    """
    query = (
        select(m.Group).where(m.Group.id == group_pk).options(_with_turns()).execution_options(populate_existing=True)
    )
    group = s.scalars(query).one()
    usage = rollout_usage(s, [group_pk])[group_pk]
    return orjson.dumps(_advantages(group, "done", stats, progress(s, group), usage, price)).decode()


def _advantages(
    group: m.Group,
    status: str,
    stats: dict[str, Any],
    counts: dict[str, int],
    usage: dict[str, Usage],
    price: JudgePrice | None,
) -> dict[str, Any]:
    rollouts = []
    for r in group.rollouts:
        turns = []
        for t in r.turns:
            final = t.type == "answer"
            turns.append(
                {
                    "index": t.index,
                    "type": t.type,
                    "credit": None if final else t.credit,
                    "process_advantage": None if final else t.process_advantage,
                    "discounted_process_advantage": None if final else t.discounted_process_advantage,
                    "advantage": t.advantage,
                    "unscorable": bool(t.unscorable),
                }
            )
        rollouts.append(
            {
                "id": r.rollout_id,
                "outcome_reward": r.outcome_reward,
                "outcome_advantage": r.outcome_advantage,
                # outcome_source judge: the reward depends on a failed rubric judgment.
                "outcome_unscorable": bool((r.outcome or {}).get("unscorable", False)),
                "usage": usage.get(r.rollout_id, Usage()).document(price),
                "turns": turns,
            }
        )
    return {
        "group_id": group.group_id,
        "status": status,
        "params": group.params,
        "stats": {k: stats.get(k) for k in ("mu_rg", "sigma_rg", "mu_o", "sigma_o")},
        "progress": {**counts, "unscorable_turns": int(stats.get("unscorable_turns", 0))},
        # Every judgment belongs to a rollout: the group's usage is the sum of theirs.
        "usage": total(usage.values()).document(price),
        "metadata": group.metadata_,
        "rollouts": rollouts,
    }


#: What a long-poll reads of each group: enough to know whether it is final, and to
#: answer at once when it is.
_FINAL_COLUMNS = (
    m.Group.id,
    m.Group.group_id,
    m.Group.status,
    m.Group.error,
    m.Group.advantages_json,
    m.Group.held_until,
    m.Group.held_for,
)


def final_states(s: Session, tenant: str, group_ids: Sequence[str]) -> list[Any]:
    """Rows of ``_FINAL_COLUMNS`` for the groups, in the order given (missing ones left out)."""
    rows = {
        r.group_id: r
        for r in s.execute(
            select(*_FINAL_COLUMNS).where(m.Group.tenant == tenant, m.Group.group_id.in_(list(group_ids)))
        )
    }
    return [rows[g] for g in group_ids if g in rows]


def final_advantages(
    s: Session, tenant: str, rows: Sequence[Any], price: JudgePrice | None = None
) -> list[orjson.Fragment]:
    """The advantages documents of done groups as JSON, from :func:`final_states` rows.

    A group done before documents were stored with their usage (revision 0008 drops the
    older ones) has its document built from its rows (its cost at ``price``).
    """
    missing = [r.group_id for r in rows if r.advantages_json is None]
    built = advantages_documents(s, tenant, missing, price)
    return [
        orjson.Fragment(r.advantages_json)
        if r.advantages_json is not None
        else orjson.Fragment(orjson.dumps(built[r.group_id]))
        for r in rows
    ]
