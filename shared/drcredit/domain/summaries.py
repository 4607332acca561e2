"""Summaries of many numbers for the analytics views: quantiles and a fixed histogram."""

from __future__ import annotations

import math
from collections.abc import Sequence

#: Bin edges of the process-advantage histogram: A_rg is a z-score, so half a standard
#: deviation per bin from -3 to 3, with everything beyond in the outer bins.
ADVANTAGE_EDGES = tuple(x / 2 for x in range(-6, 7))


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), for sorted or unsorted values."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def describe(values: Sequence[float]) -> dict[str, float] | None:
    """Count, mean, min, p10, p50, p90 and max; None for no values."""
    if not values:
        return None
    return {
        "count": len(values),
        "mean": math.fsum(values) / len(values),
        "min": min(values),
        "p10": quantile(values, 0.1),
        "p50": quantile(values, 0.5),
        "p90": quantile(values, 0.9),
        "max": max(values),
    }


def histogram(values: Sequence[float], edges: Sequence[float] = ADVANTAGE_EDGES) -> list[int]:
    """Counts in ``len(edges) + 1`` bins: below the first edge, between consecutive edges
    (each bin holds its lower edge), and from the last edge up."""
    counts = [0] * (len(edges) + 1)
    for v in values:
        counts[sum(1 for e in edges if v >= e)] += 1
    return counts
