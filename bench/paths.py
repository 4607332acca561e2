"""What a step's judge calls must take at least: its longest chain of dependent calls
(the critical-path bound), and the calls a naive scorer would make.
"""

from __future__ import annotations

import math
from typing import Any

from drcredit.domain.credit import plan_rollout
from drcredit.domain.group import GroupIn, VisitTurn


def rollout_critical_path(group: GroupIn, rollout: Any, turns: list[dict[str, Any]]) -> int:
    """A rollout's longest chain of dependent judge calls, from its credits breakdown.

    Its visit chains are as long as its judged visits (every rubric's chain has them
    all); a snippet call that was made waits for the visits whose credit decides its
    saturation, so its depth is the chain position of the last of them plus one.
    """
    plan = plan_rollout(group, rollout, group.params)
    chain = plan.chains[0].turn_indices if plan.chains else ()
    position = {t: k + 1 for k, t in enumerate(chain)}
    depth = len(chain)
    for task in plan.snippet_tasks:
        called = any(
            j["kind"] == "snippet" and j["status"] in ("ok", "failed") for j in turns[task.turn_index]["judgments"]
        )
        if called:
            depth = max(depth, 1 + max((position.get(v, 0) for v in task.navigation_visits), default=0))
    return depth


def critical_path_calls(groups: list[dict[str, Any]], credits: dict[str, Any]) -> int:
    """Longest chain of dependent judge calls in the step (see :func:`rollout_critical_path`)."""
    longest = 0
    for doc in groups:
        group = GroupIn.model_validate(doc)
        breakdown = {r["id"]: r for r in credits[doc["group_id"]]["rollouts"]}
        for rollout in group.rollouts:
            longest = max(longest, rollout_critical_path(group, rollout, breakdown[rollout.id]["turns"]))
    return longest


def naive_calls(groups: list[dict[str, Any]]) -> int:
    """Calls with no deterministic zeros, no saturation skip and no de-duplication."""
    total = 0
    for doc in groups:
        group = GroupIn.model_validate(doc)
        positive = len(group.positive_rubrics)
        for rollout in group.rollouts:
            total += positive * sum(isinstance(t, VisitTurn) for t in rollout.turns)
            total += sum(1 for t in plan_rollout(group, rollout, group.params).snippet_tasks)
    return total


def calls_saved(credits: dict[str, Any]) -> dict[str, int]:
    """Judgments made without a judge call, by reason, from the credits breakdown."""
    saved = {"deterministic_zero": 0, "saturation_skip": 0, "twin_reuse": 0}
    for doc in credits.values():
        for rollout in doc["rollouts"]:
            for turn in rollout["turns"]:
                for j in turn.get("judgments", []):
                    if j["status"] == "deterministic":
                        saved["deterministic_zero"] += 1
                    elif j["status"] == "skipped":
                        saved["saturation_skip"] += 1
                    elif j.get("cache_hit"):
                        saved["twin_reuse"] += 1
    return saved


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
