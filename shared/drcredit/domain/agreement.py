"""How much two judges agree on the same questions (docs/method.md, "Judge audit").

Pure math over pairs of ordinal values on categories ``0..m``: the share of equal
pairs, the confusion matrix (counts, rows the original judge, columns the audit judge)
and the quadratic-weighted kappa, ``1 - sum(w * O) / sum(w * E)`` with ``O`` the
observed shares, ``E`` the product of their row and column totals (what chance would
give with each judge's own distribution) and ``w = (i - j)^2 / m^2``: a disagreement of
two steps costs four times one of one step. For two categories (``m = 1``) this is
Cohen's kappa. It is undefined (None) where chance alone could not disagree
(``sum(w * E) = 0``: both judges always gave one and the same value).

Agreement is not accuracy: a second judge that moves every value one way can keep a
high kappa. The ``bias`` (mean of audit minus original, in the kind's own units) and
each side's ``marginals`` (its share of pairs in each category) show such a shift.
Labels from several people on one key count as one value, their lower median.

What a change of judge does to the training signal is measured as a sensitivity replay
measures a change of parameters (:mod:`drcredit.domain.sensitivity`), for the process
and the fused advantage alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from drcredit.domain.advantages import GroupAdvantages
from drcredit.domain.sensitivity import compare, wasserstein_1

Pair = tuple[int, int]


@dataclass(frozen=True)
class Marginals:
    """Each side's distribution over the categories: shares of its paired values."""

    original: list[float]
    audit: list[float]


@dataclass(frozen=True)
class Agreement:
    """Agreement of one kind of judgment: ``pairs`` compared, ``left_out`` because
    either side failed; ``exact`` and ``kappa`` None when there is no pair."""

    pairs: int
    left_out: int
    exact: float | None
    kappa: float | None
    #: Counts: ``confusion[i][j]`` pairs valued ``i`` by the original judge, ``j`` by the audit's.
    confusion: list[list[int]]
    #: Mean of (audit - original) over the pairs; None without a pair.
    bias: float | None = None
    #: Per side, its share of pairs in each category ``0..top``; None without a pair.
    marginals: Marginals | None = None


def confusion_matrix(pairs: Sequence[Pair], top: int) -> list[list[int]]:
    """Counts of (original, audit) values over categories ``0..top``."""
    matrix = [[0] * (top + 1) for _ in range(top + 1)]
    for original, audit in pairs:
        if not (0 <= original <= top and 0 <= audit <= top):
            raise ValueError(f"value outside 0..{top}: {(original, audit)}")
        matrix[original][audit] += 1
    return matrix


def weighted_kappa(matrix: Sequence[Sequence[int]]) -> float | None:
    """Quadratic-weighted kappa of a confusion matrix of counts (None: undefined)."""
    n = sum(sum(row) for row in matrix)
    if n == 0:
        return None
    top = len(matrix) - 1
    if top < 1:
        return None
    rows = [sum(row) / n for row in matrix]
    cols = [sum(matrix[i][j] for i in range(top + 1)) / n for j in range(top + 1)]
    observed = math.fsum((i - j) ** 2 / top**2 * matrix[i][j] / n for i in range(top + 1) for j in range(top + 1))
    expected = math.fsum((i - j) ** 2 / top**2 * rows[i] * cols[j] for i in range(top + 1) for j in range(top + 1))
    if expected == 0:
        return None
    return 1.0 - observed / expected


def bias(pairs: Sequence[Pair]) -> float | None:
    """Mean signed difference, audit minus original (None without a pair)."""
    if not pairs:
        return None
    return math.fsum(audit - original for original, audit in pairs) / len(pairs)


def marginals(matrix: Sequence[Sequence[int]]) -> Marginals | None:
    """Each side's shares per category from a confusion matrix of counts (None: empty)."""
    n = sum(sum(row) for row in matrix)
    if n == 0:
        return None
    size = len(matrix)
    return Marginals(
        original=[sum(matrix[i]) / n for i in range(size)],
        audit=[sum(matrix[i][j] for i in range(size)) / n for j in range(size)],
    )


def agreement(pairs: Sequence[Pair], top: int, left_out: int = 0) -> Agreement:
    """The agreement figures of ``pairs`` valued on ``0..top``."""
    matrix = confusion_matrix(pairs, top)
    if not pairs:
        return Agreement(0, left_out, None, None, matrix)
    exact = sum(1 for original, audit in pairs if original == audit) / len(pairs)
    return Agreement(
        len(pairs), left_out, exact, weighted_kappa(matrix), matrix, bias=bias(pairs), marginals=marginals(matrix)
    )


def lower_median(values: Sequence[int]) -> int:
    """Several people's values for one key as one: for sorted ``v1 <= ... <= vk``, the
    value ``v_ceil(k/2)`` (the lower of the two middle values when ``k`` is even)."""
    if not values:
        raise ValueError("no value to reduce")
    ordered = sorted(values)
    return ordered[(len(ordered) + 1) // 2 - 1]


def rmse(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Root mean squared difference of paired values (None without a pair)."""
    if not pairs:
        return None
    return math.sqrt(math.fsum((a - b) ** 2 for a, b in pairs) / len(pairs))


@dataclass(frozen=True)
class Effect:
    """How far the training signal moves from one judge to the other over corresponding
    non-final turns: W1 of the pooled distributions, RMSE over the turns and sign
    agreement, of the process advantage ``A_rg`` and of the fused advantage."""

    turns: int
    w1: float
    rmse: float
    fused_w1: float
    fused_rmse: float
    process_sign_agreement: float
    fused_sign_agreement: float


def effect(originals: Sequence[GroupAdvantages], audits: Sequence[GroupAdvantages]) -> Effect:
    """The :class:`Effect` pooled over the groups' corresponding turns (as the
    sensitivity replay compares a reference with a replay)."""
    process = compare(originals, audits)
    fused = [
        (ta.advantage, tb.advantage)
        for ga, gb in zip(originals, audits, strict=True)
        for ra, rb in zip(ga.rollouts, gb.rollouts, strict=True)
        for ta, tb in zip(ra.turns, rb.turns, strict=True)
        if ta.process_advantage is not None and tb.process_advantage is not None
    ]
    return Effect(
        turns=process.turns,
        w1=process.wasserstein_1,
        rmse=process.rmse,
        fused_w1=wasserstein_1([a for a, _ in fused], [b for _, b in fused]),
        fused_rmse=rmse(fused) or 0.0,
        process_sign_agreement=process.process_sign_agreement,
        fused_sign_agreement=process.fused_sign_agreement,
    )
