"""The judge's levels step by step over a run, and each step's drift from the run's first
steps (docs/method.md, "Drift over a run"; the arithmetic: :mod:`drcredit.domain.drift`).

Counted: the judgments the judge answered (status ``ok``, reused answers included) of
every group of the step, whatever the group's status. A failed judgment has no level; a
visit settled without a call (no usable page) or a snippet call skipped under saturation
is not the judge's answer, so neither moves the distribution.

Two readers: the run document (every step) and the API's ``/metrics`` (each recent run's
latest finished step, :mod:`drcredit.analytics.recent_steps`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from drcredit.domain.drift import BASELINE_STEPS, DRIFT_KINDS, level_counts, pooled, run_drift, shares
from drcredit.storage import models as m

#: The judgment kind stored for each kind followed (report rubric scores are ``rubric`` rows).
STORED_KIND = {"visit": "visit", "report_rubric": "rubric"}
_KIND_OF_STORED = {v: k for k, v in STORED_KIND.items()}

#: Per step: per kind, the level counts 0..top.
StepLevels = dict[str, tuple[int, ...]]


def levels_by_step(s: Session, tenant: str, run: str, steps: Sequence[int]) -> dict[int, StepLevels]:
    """Level counts of each of the run's ``steps`` (all zero for a step without a judgment)."""
    query = (
        select(m.Group.step, m.Judgment.kind, m.Judgment.level, func.count())
        .join(m.Group, m.Group.id == m.Judgment.group_pk)
        .where(
            m.Group.tenant == tenant,
            m.Group.run == run,
            m.Group.step.is_not(None),
            m.Judgment.status == "ok",
            m.Judgment.kind.in_(tuple(STORED_KIND.values())),
            m.Judgment.level.is_not(None),
        )
        .group_by(m.Group.step, m.Judgment.kind, m.Judgment.level)
    )
    if len(steps) <= _LISTED_STEPS:
        query = query.where(m.Group.step.in_(list(steps)))
    found: dict[int, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for step, kind, level, count in s.execute(query):
        if step is not None and level is not None:  # excluded by the query; for the types
            found[step][_KIND_OF_STORED[kind]].append((level, count))
    return {step: {kind: level_counts(found[step][kind], top) for kind, top in DRIFT_KINDS.items()} for step in steps}


#: Up to this many steps are named in the query; more, and the whole run is read.
_LISTED_STEPS = 16


def _levels_document(counts: tuple[int, ...]) -> dict[str, Any]:
    return {"judgments": sum(counts), "counts": list(counts), "shares": _list(shares(counts))}


def _list(values: tuple[float, ...] | None) -> list[float] | None:
    return None if values is None else list(values)


@dataclass(frozen=True)
class RunDrift:
    """The run's drift section: per numbered step its levels and drift, and the baseline."""

    judge_levels: dict[int, dict[str, dict[str, Any]]]
    drift: dict[int, dict[str, dict[str, Any]]]
    baseline: dict[str, Any]


def run_drift_section(levels: dict[int, StepLevels], threshold: float) -> RunDrift:
    """Per step (numbered steps in order) and kind: the distribution and the drift."""
    ordered = sorted(levels)
    judge_levels = {step: {kind: _levels_document(levels[step][kind]) for kind in DRIFT_KINDS} for step in ordered}
    drift: dict[int, dict[str, dict[str, Any]]] = {step: {} for step in ordered}
    base_levels = {}
    for kind in DRIFT_KINDS:
        per_step = [levels[step][kind] for step in ordered]
        for step, d in zip(ordered, run_drift(per_step, threshold), strict=True):
            drift[step][kind] = {"value": d.drift, "flagged": d.flagged}
        if len(ordered) > BASELINE_STEPS:
            base_levels[kind] = _levels_document(pooled(per_step[:BASELINE_STEPS]))
    baseline = {
        "threshold": threshold,
        "steps": ordered[:BASELINE_STEPS] if len(ordered) > BASELINE_STEPS else [],
        "judge_levels": base_levels or None,
    }
    return RunDrift(judge_levels, drift, baseline)
