"""Drift of the judge's levels over a training run (docs/method.md, "Drift over a run").

Per step, the distribution of the levels the judge gave (visit levels 0-2, report rubric
scores 0-4) over its judgments that did not fail; a step's drift is the total variation
distance between that distribution and the pooled one of the run's first three steps,
and it is flagged when the drift is strictly above a threshold. A judge endpoint swapped,
a prompt changed or a policy that learned to please the judge moves these distributions
before it moves anything a trainer watches.

The arithmetic is exact (fractions of counts), so that a drift equal to the threshold is
never flagged by a rounding error.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

#: Steps pooled into the baseline a later step is compared with.
BASELINE_STEPS = 3
DEFAULT_DRIFT_THRESHOLD = 0.15
#: The kinds of judgment whose levels are followed, and the top of each one's categories (0..top).
DRIFT_KINDS = {"visit": 2, "report_rubric": 4}


def level_counts(levels: Iterable[tuple[int, int]], top: int) -> tuple[int, ...]:
    """Counts per category ``0..top`` from (level, how many) pairs; a level outside is refused."""
    counts = [0] * (top + 1)
    for level, n in levels:
        if not 0 <= level <= top:
            raise ValueError(f"level {level} is outside the categories 0..{top}")
        counts[level] += n
    return tuple(counts)


def shares(counts: Sequence[int]) -> tuple[float, ...] | None:
    """The distribution the counts make; None when there is nothing to count."""
    n = sum(counts)
    return tuple(c / n for c in counts) if n else None


def pooled(steps: Iterable[Sequence[int]]) -> tuple[int, ...]:
    """The steps' counts added category by category (their judgments pooled)."""
    rows = list(steps)
    if not rows:
        return ()
    return tuple(sum(col) for col in zip(*rows, strict=True))


def total_variation(p_counts: Sequence[int], q_counts: Sequence[int]) -> Fraction | None:
    """0.5 * sum_i |p_i - q_i| between the distributions of two count vectors (exact);
    None when either has no judgment."""
    if len(p_counts) != len(q_counts):
        raise ValueError(f"{len(p_counts)} categories against {len(q_counts)}")
    n, m = sum(p_counts), sum(q_counts)
    if not n or not m:
        return None
    return sum((abs(Fraction(p, n) - Fraction(q, m)) for p, q in zip(p_counts, q_counts, strict=True)), Fraction(0)) / 2


@dataclass(frozen=True)
class StepDrift:
    """One step's drift from the run's baseline: null for the baseline's own steps, in a run
    too short to have a step after them, or when either side has no judgment."""

    drift: float | None
    flagged: bool


def run_drift(steps: Sequence[Sequence[int]], threshold: float = DEFAULT_DRIFT_THRESHOLD) -> list[StepDrift]:
    """Each step's drift, for the steps' level counts given in step order."""
    if len(steps) <= BASELINE_STEPS:
        return [StepDrift(None, False) for _ in steps]
    baseline = pooled(steps[:BASELINE_STEPS])
    # The threshold as the decimal the operator wrote (0.15 is 3/20, not the float below it).
    bound = Fraction(repr(threshold))
    out = [StepDrift(None, False) for _ in steps[:BASELINE_STEPS]]
    for counts in steps[BASELINE_STEPS:]:
        tvd = total_variation(counts, baseline)
        out.append(StepDrift(None if tvd is None else float(tvd), tvd is not None and tvd > bound))
    return out


def validate_threshold(value: float, name: str = "drift_threshold") -> float:
    """A threshold is a distance between distributions: within [0, 1]."""
    if not 0 <= value <= 1:
        raise ValueError(f"{name} must be between 0 and 1, got {value!r}")
    return value
