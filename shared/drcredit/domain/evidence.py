"""The evidence proxy (docs/method.md, "Evidence proxy"): how fast rollouts gather evidence per budget.

A research turn (``search`` or ``visit``) contributes ``u``: its uncapped visit credit,
or its snippet credit (``eta`` times its accepted matches, uncapped); navigation credit is
left out, since it repeats credit its visits already earned. For a budget ``b`` a rollout
with ``T`` research turns has gathered ``C_i(b)``, the sum of ``u`` over its first
``min(b, T)`` research turns, at a rate of ``C_i(b) / min(b, T)``. ``C(b)`` and ``U(b)``
are the means over rollouts; a rollout with no research turn has neither and is left out
of both (as in the paper's definition, which ranges over trajectories with ``T_i > 0``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: The paper's budgets: 2, 4, ..., 14 research turns.
DEFAULT_BUDGETS = (2, 4, 6, 8, 10, 12, 14)

RESEARCH_TYPES = ("search", "visit")


@dataclass(frozen=True)
class EvidencePoint:
    budget: int
    #: C(b); None when no rollout has a research turn.
    cumulative: float | None
    #: U(b); None when no rollout has a research turn.
    rate: float | None
    #: Rollouts averaged (those with at least one research turn).
    rollouts: int


def contribution(turn_type: str, visit_credit_uncapped: float | None, snippet_matches: int | None, eta: float) -> float:
    """``u`` of one research turn (0 for a turn whose judgment failed or was skipped)."""
    if turn_type == "visit":
        return visit_credit_uncapped or 0.0
    if turn_type == "search":
        return eta * (snippet_matches or 0)
    raise ValueError(f"not a research turn: {turn_type!r}")


def evidence_curve(
    contributions: Sequence[Sequence[float]], budgets: Sequence[int] = DEFAULT_BUDGETS
) -> list[EvidencePoint]:
    """C(b) and U(b) for each budget, from each rollout's ``u`` in research-turn order."""
    if any(b < 1 for b in budgets):
        raise ValueError("budgets must be positive")
    counted = [list(u) for u in contributions if u]
    points = []
    for b in budgets:
        if not counted:
            points.append(EvidencePoint(b, None, None, 0))
            continue
        sums = [math.fsum(u[:b]) for u in counted]
        rates = [total / min(b, len(u)) for total, u in zip(sums, counted, strict=True)]
        points.append(EvidencePoint(b, math.fsum(sums) / len(sums), math.fsum(rates) / len(rates), len(counted)))
    return points
