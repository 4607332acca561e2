"""Group normalization, discounting and fusion of credits (docs/method.md, "Advantages")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from drcredit.domain.credit import RolloutCredits, TurnCredit
from drcredit.domain.group import GroupContent
from drcredit.domain.params import ScoringParams

#: Below this standard deviation a group carries no signal and advantages are zero.
SIGMA_FLOOR = 1e-12


@dataclass(frozen=True)
class TurnAdvantage:
    index: int
    type: str
    #: The turn's credit; None on the final answer and, under ``exclude``, on an
    #: unscorable turn.
    credit: float | None
    #: A_rg = (c - mu_rg) / sigma_rg (0 for an excluded turn); None on the final answer.
    process_advantage: float | None
    #: The discounted process advantage D (equal to A_rg when gamma = 0).
    discounted_process_advantage: float | None
    advantage: float
    #: The credit depends on a failed judgment (docs/method.md, "Judge failures").
    unscorable: bool = False


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
    #: Non-final turns whose credit depends on a failed judgment.
    unscorable_turns: int = 0


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
    """Fused per-turn advantages of every rollout in the group.

    Under ``on_judge_failure: exclude`` an unscorable turn is left out of ``mu_rg`` and
    ``sigma_rg``, has no credit and an ``A_rg`` of 0 (docs/method.md, "Judge failures"); under the other
    policies it is scored like any turn and only flagged.
    """
    by_id = {c.rollout_id: c for c in credits}
    ordered = [by_id[r.id] for r in group.rollouts]
    exclude = params.on_judge_failure == "exclude"

    def counted(t: TurnCredit) -> float | None:
        return None if t.credit is None or (exclude and t.unscorable) else t.credit

    pooled = [c for rc in ordered for c in map(counted, rc.turns) if c is not None]
    mu_rg, sigma_rg = mean_and_std(pooled, ddof=0)
    mu_o, sigma_o, outcome = outcome_advantages([r.outcome_reward for r in group.rollouts])

    out = []
    for rollout, rc, a_o in zip(group.rollouts, ordered, outcome, strict=True):
        normalized: list[float | None] = []
        for tc in rc.turns:
            c = counted(tc)
            normalized.append(
                standardize(c, mu_rg, sigma_rg) if c is not None else (None if tc.credit is None else 0.0)
            )
        discounted: list[float | None] = [None] * len(rc.turns)
        following = 0.0
        for k in reversed(range(len(rc.turns))):
            value = normalized[k]
            if value is None:
                continue
            following = value + params.discount * following
            discounted[k] = following
        turns = []
        for tc, a_rg, d in zip(rc.turns, normalized, discounted, strict=True):
            if d is None:
                advantage = a_o
            elif params.outcome_on_research_turns:
                advantage = a_o + params.process_weight * d
            else:
                advantage = params.process_weight * d
            turns.append(TurnAdvantage(tc.index, tc.type, counted(tc), a_rg, d, advantage, tc.unscorable))
        out.append(RolloutAdvantages(rollout.id, rollout.outcome_reward, a_o, tuple(turns)))
    unscorable = sum(1 for rc in ordered for t in rc.turns if t.unscorable)
    return GroupAdvantages(GroupStats(mu_rg, sigma_rg, mu_o, sigma_o, len(pooled), unscorable), tuple(out))


def outcome_advantages(rewards: Sequence[float | None]) -> tuple[float | None, float | None, list[float]]:
    """(mu_o, sigma_o, A_o per rollout) over the rollouts that have a reward (docs/method.md, "Advantages").

    A group where no rollout has a reward has no outcome signal (``mu_o``/``sigma_o``
    None, every ``A_o`` 0). Rollouts without a reward among others (an unscorable judged
    reward under ``exclude``, see docs/method.md, "Judge failures") get ``A_o = 0`` and are left out of the
    statistics; fewer than two rewards left give ``A_o = 0`` for all.
    """
    present = [float(r) for r in rewards if r is not None]
    if not present:
        return None, None, [0.0] * len(rewards)
    mu_o, sigma_o = mean_and_std(present, ddof=1)
    if len(present) < 2:
        return mu_o, sigma_o, [0.0] * len(rewards)
    return mu_o, sigma_o, [0.0 if r is None else standardize(float(r), mu_o, sigma_o) for r in rewards]
