"""Sensitivity replay pooled over a batch's groups (docs/method.md, "Sensitivity replay"; the paper's Table 6).

Each scenario changes only the credit parameters; every done group of the batch is
replayed from its stored judgments and the corresponding turns of all groups are pooled.
A scenario that needs a snippet judgment skipped under saturation reports bounds (the
worse of no match and a match per positive rubric), never a guess presented as exact.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from drcredit.scoring.results.replay import pooled_sensitivity, replay_group
from drcredit.storage import models as m

#: The paper's displayed settings, each against the group's own parameters.
SCENARIOS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("visit levels (0, 0.25, 0.5)", {"visit_levels": [0.0, 0.25, 0.5]}),
    ("visit levels (0, 0.2, 1.0)", {"visit_levels": [0.0, 0.2, 1.0]}),
    ("cap 0.75", {"cap": 0.75}),
    ("cap 1.25", {"cap": 1.25}),
    ("snippet weight 0.025", {"snippet_weight": 0.025}),
    ("snippet weight 0.30", {"snippet_weight": 0.30}),
    ("partial 0.1, cap 0.5", {"visit_levels": [0.0, 0.1, 0.5], "cap": 0.5}),
)


def _done_groups(s: Session, batch: m.Batch) -> list[m.Group]:
    return list(
        s.scalars(select(m.Group).where(m.Group.batch_pk == batch.id, m.Group.status == "done").order_by(m.Group.id))
    )


def scenario(s: Session, groups: list[m.Group], overrides: dict[str, Any]) -> dict[str, Any]:
    replays = [replay_group(s, g, overrides) for g in groups]
    bounded = sum(len(r.bounded) for r in replays)
    return {
        "params": overrides,
        "exact": bounded == 0,
        "bounded_turns": bounded,
        "sensitivity": asdict(pooled_sensitivity(replays)) if replays else None,
    }


def batch_sensitivity(s: Session, batch: m.Batch, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """One scenario (``overrides``) or, without, the paper's table of scenarios."""
    groups = _done_groups(s, batch)
    base = {"batch_id": batch.batch_id, "groups": len(groups), "groups_in_batch": len(batch.group_ids)}
    if overrides is not None:
        return {**base, **scenario(s, groups, overrides)}
    return {**base, "scenarios": [{"name": name, **scenario(s, groups, o)} for name, o in SCENARIOS]}
