"""Judge usage of groups and rollouts, summed in SQL over their stored judgments.

Every judgment belongs to a rollout (visit and snippet judgments to its research turns,
rubric and citation judgments to its answer), so a group's usage is the sum of its
rollouts'. A reused answer (``cache_hit``: a twin's in the group, or with ``reused`` the
tenant's store's) is stored with no attempts and no tokens: it adds no call and no
token, and those from the store are counted as ``reused``. See :class:`drcredit.domain.usage.Usage` for what each field counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Integer, and_, case, func, select
from sqlalchemy.orm import Session

from drcredit.domain.usage import Usage, total
from drcredit.storage import models as m

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
