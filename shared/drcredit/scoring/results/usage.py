"""Judge usage of groups and rollouts, summed in SQL over their stored judgments.

Every judgment belongs to a rollout (visit and snippet judgments to its research turns,
rubric and citation judgments to its answer), so a group's usage is the sum of its
rollouts'. A reused answer (``cache_hit``: a twin's in the group, or with ``reused`` the
tenant's store's) is stored with no attempts and no tokens: it adds no call and no
token, and those from the store are counted as ``reused``. See :class:`drcredit.domain.usage.Usage` for what each field counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, and_, case, func, literal, select, union_all
from sqlalchemy.orm import Session

from drcredit.domain.usage import Usage, total
from drcredit.storage import models as m
from drcredit.storage.database import insert_for

#: A judgment answered by a call of its own.
_ANSWERED = case(
    (and_(m.Judgment.status.in_(("ok", "failed")), m.Judgment.cache_hit.is_(False)), 1),
    else_=0,
)


def _sums() -> tuple[Any, ...]:
    j = m.Judgment
    return (
        func.coalesce(func.sum(j.attempt_count), 0),
        func.coalesce(func.sum(_ANSWERED.cast(Integer)), 0),
        func.coalesce(func.sum(j.prompt_tokens), 0),
        func.coalesce(func.sum(j.completion_tokens), 0),
        func.coalesce(func.sum(j.cached_prompt_tokens), 0),
        func.coalesce(func.sum(j.estimated_prompt_tokens), 0),
        func.coalesce(func.sum(j.reused.cast(Integer)), 0),
    )


def rollout_usage(s: Session, group_pks: Sequence[int]) -> dict[int, dict[str, Usage]]:
    """Per group, per rollout id: the usage of its judgments (rollouts without any left out)."""
    out: dict[int, dict[str, Usage]] = {pk: {} for pk in group_pks}
    if not group_pks:
        return out
    rows = s.execute(
        select(m.Judgment.group_pk, m.Judgment.rollout_id, *_sums())
        .where(m.Judgment.group_pk.in_(list(group_pks)))
        .group_by(m.Judgment.group_pk, m.Judgment.rollout_id)
    )
    for group_pk, rollout_id, *sums in rows:
        out[group_pk][rollout_id] = Usage(*(int(v) for v in sums))
    return out


def group_usage(s: Session, group_pks: Sequence[int]) -> dict[int, Usage]:
    """Per group: the usage of all its judgments (the sum of its rollouts')."""
    return {pk: total(by_rollout.values()) for pk, by_rollout in rollout_usage(s, group_pks).items()}


# ---------------------------------------------------------------------- tenants

#: The usage columns a tenant's ledger keeps, in :class:`Usage` order.
_LEDGER = (
    "calls",
    "judgments",
    "prompt_tokens",
    "completion_tokens",
    "cached_prompt_tokens",
    "estimated_prompt_tokens",
    "reused",
)


def record_tenant_usage(s: Session, group_pk: int, bucket: datetime) -> None:
    """Add a group's usage to its tenant's ledger at ``bucket``, in the transaction that
    makes the group final (so the group counts once: in its judgments while it runs,
    here after)."""
    tenant = s.scalar(select(m.Group.tenant).where(m.Group.id == group_pk))
    if tenant is None:
        return
    add_tenant_usage(s, tenant, bucket, group_usage(s, [group_pk])[group_pk])


def add_tenant_usage(s: Session, tenant: str, bucket: datetime, used: Usage) -> None:
    """Add ``used`` to ``tenant``'s ledger row at ``bucket`` (one upsert): the one place
    the ledger is written, for groups and judge audits alike. The caller's transaction
    is the one that makes the work final, so it counts once."""
    if used == Usage():
        return
    values = {"tenant": tenant, "bucket": bucket, **{c: getattr(used, c) for c in _LEDGER}}
    statement = insert_for(s, m.TenantUsage).values(**values)
    t = m.TenantUsage.__table__
    s.execute(
        statement.on_conflict_do_update(
            index_elements=["tenant", "bucket"], set_={c: t.c[c] + statement.excluded[c] for c in _LEDGER}
        )
    )


def tenant_usage(s: Session, tenant: str, windows: Mapping[str, tuple[datetime, datetime]]) -> dict[str, Usage]:
    """Per named window (start, end): the tenant's usage: the ledger of its finished
    groups and judge audits in the window, plus every judgment of its groups still open (they count in the
    current window). One statement, so a group that ends meanwhile counts once."""
    t = m.TenantUsage
    j, g = m.Judgment, m.Group
    parts = []
    for name, (start, end) in windows.items():
        parts.append(
            select(literal(name).label("window"), *(func.coalesce(func.sum(getattr(t, c)), 0) for c in _LEDGER)).where(
                t.tenant == tenant, t.bucket >= start, t.bucket < end
            )
        )
    live = (
        select(literal("live").label("window"), *_sums())
        .select_from(j)
        .join(g, g.id == j.group_pk)
        .where(g.tenant == tenant, g.status.in_(("queued", "running")))
    )
    rows: dict[str, Usage] = {}
    row: Any
    for row in s.execute(union_all(*parts, live)):
        rows[str(row[0])] = Usage(*(int(v) for v in row[1:]))
    return {name: rows.get(name, Usage()) + rows.get("live", Usage()) for name in windows}
