"""Support histories (docs/method.md, "Visit credit"), read back from the stored visit judgments.

A rubric's history in a rollout is the support points of its level 1 and 2 visit
judgments, in turn order: only one chain appends to it, one judgment at a time, so the
judgments alone record it. A resumed chain reads where its history stood, and the
credits breakdown shows it.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import select
from sqlalchemy.orm import Session

from drcredit.storage import models as m

#: (group row id, rollout id, rubric id) of one history.
HistoryKey = tuple[int, str, str]


def support_histories(
    s: Session, group_pks: Collection[int], rollout_ids: Collection[str] | None = None
) -> dict[HistoryKey, list[tuple[int, str]]]:
    """Each history of these groups (and rollouts) as (turn index, support point), in order."""
    j = m.Judgment
    query = (
        select(j.group_pk, j.rollout_id, j.rubric_id, j.turn_index, j.support_points)
        .where(j.group_pk.in_(list(group_pks)), j.kind == "visit", j.status == "ok", j.level > 0)
        .order_by(j.group_pk, j.rollout_id, j.rubric_id, j.turn_index)
    )
    if rollout_ids is not None:
        query = query.where(j.rollout_id.in_(list(rollout_ids)))
    histories: dict[HistoryKey, list[tuple[int, str]]] = {}
    for group_pk, rollout_id, rubric_id, turn_index, points in s.execute(query):
        histories.setdefault((group_pk, rollout_id, rubric_id), []).extend((turn_index, p) for p in points or ())
    return histories
