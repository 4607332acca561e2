"""Group normalization, discounting and fusion of credits (SPEC section 6)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from drcredit.domain.credit import RolloutCredits
from drcredit.domain.group import GroupContent
from drcredit.domain.params import ScoringParams

#: Below this standard deviation a group carries no signal and advantages are zero.
SIGMA_FLOOR = 1e-12


@dataclass(frozen=True)
class TurnAdvantage:
    index: int
    type: str
    credit: float | None
    #: (c - mu_rg) / sigma_rg; None on the final answer.
    normalized_credit: float | None
    #: The discounted process advantage D (equal to normalized_credit when gamma = 0).
    process_advantage: float | None
    advantage: float


@dataclass(frozen=True)
class RolloutAdvantages:
    rollout_id: str
    outcome_reward: float | None
    outcome_advantage: float
    turns: tuple[TurnAdvantage, ...]


@dataclass(frozen=True)
class GroupStats:
    mu_rg: float
    sigma_rg: float
    mu_o: float | None
    sigma_o: float | None
    research_turns: int


@dataclass(frozen=True)
class GroupAdvantages:
    stats: GroupStats
    rollouts: tuple[RolloutAdvantages, ...]


#: Above this magnitude squares and sums could overflow; such values are rescaled.
_LARGE = 1e150


def mean_and_std(values: Sequence[float], ddof: int) -> tuple[float, float]:
    """Mean and standard deviation with ``ddof`` (0: population, 1: sample), exactly summed.

    Values large enough to overflow a sum of squares are divided by their largest
    magnitude first; ordinary values are used as they are, so results are bit-for-bit
    the straightforward formula's.
    """
    n = len(values)
    if n == 0:
        return 0.0, 0.0
    scale = max(abs(v) for v in values)
    if scale > _LARGE:
        mu_s, sigma_s = mean_and_std([v / scale for v in values], ddof)
        return mu_s * scale, sigma_s * scale
    mu = math.fsum(values) / n
    if n - ddof <= 0:
        return mu, 0.0
    return mu, math.sqrt(math.fsum((v - mu) ** 2 for v in values) / (n - ddof))


def standardize(value: float, mu: float, sigma: float) -> float:
    """(value - mu) / sigma, without overflowing for huge magnitudes; 0 when sigma ~ 0."""
    if sigma < SIGMA_FLOOR:
        return 0.0
    if abs(value) > _LARGE or abs(mu) > _LARGE:
        scale = max(abs(value), abs(mu))
        return (value / scale - mu / scale) / (sigma / scale)
    return (value - mu) / sigma


def group_advantages(group: GroupContent, credits: Sequence[RolloutCredits], params: ScoringParams) -> GroupAdvantages:
    """Fused per-turn advantages of every rollout in the group."""
    by_id = {c.rollout_id: c for c in credits}
    ordered = [by_id[r.id] for r in group.rollouts]

    pooled = [t.credit for rc in ordered for t in rc.turns if t.credit is not None]
    mu_rg, sigma_rg = mean_and_std(pooled, ddof=0)

    rewards = [r.outcome_reward for r in group.rollouts]
    if all(r is not None for r in rewards):
        present = [float(r) for r in rewards if r is not None]
        mu_o: float | None
        sigma_o: float | None
        mu_o, sigma_o = mean_and_std(present, ddof=1)
        outcome = [standardize(r, mu_o, sigma_o) for r in present]
    else:
        mu_o = sigma_o = None
        outcome = [0.0] * len(rewards)

    out = []
    for rollout, rc, a_o in zip(group.rollouts, ordered, outcome, strict=True):
        normalized = [None if t.credit is None else standardize(t.credit, mu_rg, sigma_rg) for t in rc.turns]
        discounted: list[float | None] = [None] * len(rc.turns)
        following = 0.0
        for t in reversed(range(len(rc.turns))):
            value = normalized[t]
            if value is None:
                continue
            following = value + params.discount * following
            discounted[t] = following
        turns = []
        for tc, norm, d in zip(rc.turns, normalized, discounted, strict=True):
            if d is None:
                advantage = a_o
            elif params.outcome_on_research_turns:
                advantage = a_o + params.process_weight * d
            else:
                advantage = params.process_weight * d
            turns.append(TurnAdvantage(tc.index, tc.type, tc.credit, norm, d, advantage))
        out.append(RolloutAdvantages(rollout.id, rollout.outcome_reward, a_o, tuple(turns)))
    return GroupAdvantages(GroupStats(mu_rg, sigma_rg, mu_o, sigma_o, len(pooled)), tuple(out))
