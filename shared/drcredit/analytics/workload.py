"""A run's scoring workload in one row, as the paper reports it for a training run.

Per step, then averaged over the steps that scored trajectories (each step weighs the
same, however many trajectories it had): the process judge tasks per trajectory (the
visit and snippet judgments that made a call of their own: deterministic zeros, skipped
snippet calls and reused answers are no task, and a task's retries are not counted
apart), the outcome judge tasks per trajectory, the scoring latency per trajectory (the
step's mean from a rollout's arrival to its group's advantages) and the judge's usage
per trajectory; and the run's usage in all (every group, failed ones too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from drcredit.domain.usage import JudgePrice, Usage, mean_of


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return math.fsum(present) / len(present) if present else None


def workload(steps: Sequence[dict[str, Any]], spent: Usage, price: JudgePrice | None) -> dict[str, Any]:
    """The row, from the run document's steps and the run's total usage."""
    scored = [s for s in steps if s["trajectories"]]
    latency = [s["latency_per_trajectory_s"]["mean"] if s["latency_per_trajectory_s"] else None for s in scored]
    return {
        "steps": len(scored),
        "trajectories": sum(s["trajectories"] for s in scored),
        "process_judge_tasks_per_trajectory": _mean([s["judge_calls"]["process_per_trajectory"] for s in scored]),
        "outcome_judge_tasks_per_trajectory": _mean([s["judge_calls"]["outcome_per_trajectory"] for s in scored]),
        "scoring_latency_per_trajectory_s": _mean(latency),
        "usage_per_trajectory": mean_of(s["usage_per_trajectory"] for s in scored),
        "usage": spent.document(price),
    }
