"""How far a replay under other parameters moves the signal (docs/method.md, "Sensitivity replay").

Compares a reference run with a replay over corresponding non-final turns: the
1-Wasserstein distance between the pooled process-advantage distributions, the RMSE
between corresponding process advantages, and how often process and fused advantages
keep their sign (values within 1e-6 of zero are neutral, a sign of their own).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from drcredit.domain.advantages import GroupAdvantages

NEUTRAL_BAND = 1e-6


@dataclass(frozen=True)
class Sensitivity:
    turns: int
    wasserstein_1: float
    rmse: float
    process_sign_agreement: float
    fused_sign_agreement: float


def _sign(x: float) -> int:
    return 0 if abs(x) <= NEUTRAL_BAND else (1 if x > 0 else -1)


def wasserstein_1(a: Sequence[float], b: Sequence[float]) -> float:
    """W1 between two empirical distributions of equal size: mean gap of sorted samples."""
    if len(a) != len(b):
        raise ValueError("distributions must have the same number of samples")
    if not a:
        return 0.0
    return math.fsum(abs(x - y) for x, y in zip(sorted(a), sorted(b), strict=True)) / len(a)


def _pairs(reference: GroupAdvantages, replay: GroupAdvantages) -> list[tuple[float, float, float, float]]:
    pairs = []
    for ra, rb in zip(reference.rollouts, replay.rollouts, strict=True):
        for ta, tb in zip(ra.turns, rb.turns, strict=True):
            if ta.process_advantage is None or tb.process_advantage is None:
                continue
            pairs.append((ta.process_advantage, tb.process_advantage, ta.advantage, tb.advantage))
    return pairs


def compare(references: Sequence[GroupAdvantages], replays: Sequence[GroupAdvantages]) -> Sensitivity:
    """Pool corresponding turns over one or more groups and measure the change."""
    pairs = [p for ref, rep in zip(references, replays, strict=True) for p in _pairs(ref, rep)]
    n = len(pairs)
    if n == 0:
        return Sensitivity(0, 0.0, 0.0, 1.0, 1.0)
    pa, pb = [p[0] for p in pairs], [p[1] for p in pairs]
    return Sensitivity(
        turns=n,
        wasserstein_1=wasserstein_1(pa, pb),
        rmse=math.sqrt(math.fsum((x - y) ** 2 for x, y in zip(pa, pb, strict=True)) / n),
        process_sign_agreement=sum(_sign(x) == _sign(y) for x, y in zip(pa, pb, strict=True)) / n,
        fused_sign_agreement=sum(_sign(p[2]) == _sign(p[3]) for p in pairs) / n,
    )


def worst_case(candidates: Sequence[Sensitivity]) -> Sensitivity:
    """The most pessimistic figure of each metric over several scenarios."""
    return Sensitivity(
        turns=candidates[0].turns,
        wasserstein_1=max(c.wasserstein_1 for c in candidates),
        rmse=max(c.rmse for c in candidates),
        process_sign_agreement=min(c.process_sign_agreement for c in candidates),
        fused_sign_agreement=min(c.fused_sign_agreement for c in candidates),
    )
