"""An audit against people: the original judgments paired with the labels, and the
labelers with each other.

Per key the chosen labelers' values count as one, their lower median; a key whose
original judgment failed is left out; a key nobody labeled is no pair. Every figure of
a judge audit (exact, kappa, confusion, bias, marginals) is computed on these pairs.
Each pair of labelers is compared on the keys both labeled, the first by name order
standing where the original judge stands. No training signal is recomputed: there is
no second set of advantages to compare, so the document's ``effect`` is null.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

from drcredit.audit.labels.keys import Key, Original
from drcredit.audit.report import KINDS, agreement_json
from drcredit.domain.agreement import Pair, agreement, lower_median

#: Per key, each labeler's value.
Labels = Mapping[Key, Mapping[str, int]]


def pair_with_labels(
    original: Mapping[Key, Original], labels: Labels, history: bool
) -> dict[str, tuple[list[Pair], int, list[Pair], int]]:
    """Per kind: (pairs, left out, first-visit pairs, first-visit left out) of one group.

    ``history``: the judge was shown the support already credited (the group's
    parameter); a visit key whose judge saw no history also counts as a first visit.
    """
    out: dict[str, tuple[list[Pair], int, list[Pair], int]] = {kind: ([], 0, [], 0) for kind in KINDS}
    for key, by_labeler in labels.items():
        judged = original.get(key)
        if judged is None or not by_labeler:
            continue
        kind = key[0]
        pairs, left_out, first, first_left_out = out[kind]
        is_first = kind == "visit" and (not history or judged.history == 0)
        if judged.status != "ok" or judged.value is None:
            out[kind] = (pairs, left_out + 1, first, first_left_out + int(is_first))
            continue
        pair = (judged.value, lower_median(list(by_labeler.values())))
        pairs.append(pair)
        if is_first:
            first.append(pair)
    return out


def labeler_pairs(labels: Sequence[Labels]) -> dict[tuple[str, str], dict[str, list[Pair]]]:
    """Per pair of labelers (by name order), per kind, their values on the keys both labeled."""
    names = sorted({name for group in labels for values in group.values() for name in values})
    out: dict[tuple[str, str], dict[str, list[Pair]]] = {
        pair: {kind: [] for kind in KINDS} for pair in combinations(names, 2)
    }
    for group in labels:
        for key, values in group.items():
            for a, b in combinations(sorted(values), 2):
                out[(a, b)][key[0]].append((values[a], values[b]))
    return out


def human_report(groups: Sequence[tuple[Mapping[Key, Original], Labels, bool]]) -> dict[str, Any]:
    """The agreement of the original judge with the labels, and the labelers' own."""
    pooled: dict[str, tuple[list[Pair], int, list[Pair], int]] = {kind: ([], 0, [], 0) for kind in KINDS}
    for original, labels, history in groups:
        for kind, (pairs, left_out, first, first_left_out) in pair_with_labels(original, labels, history).items():
            p, lo, f, flo = pooled[kind]
            pooled[kind] = (p + pairs, lo + left_out, f + first, flo + first_left_out)
    agreements: dict[str, Any] = {}
    for kind, top in KINDS.items():
        pairs, left_out, first, first_left_out = pooled[kind]
        agreements[kind] = agreement_json(agreement(pairs, top, left_out))
        if kind == "visit":
            agreements[kind]["first_visit"] = agreement_json(agreement(first, top, first_left_out))
    counts: dict[str, int] = {}
    for _, labels, _ in groups:
        for values in labels.values():
            for name in values:
                counts[name] = counts.get(name, 0) + 1
    between = [
        {
            "original": a,
            "audit": b,
            "agreement": {kind: agreement_json(agreement(pairs[kind], top)) for kind, top in KINDS.items()},
        }
        for (a, b), pairs in sorted(labeler_pairs([labels for _, labels, _ in groups]).items())
    ]
    return {
        "agreement": agreements,
        "labelers": {"labels": dict(sorted(counts.items())), "pairs": between},
        "labeled_keys": sum(len(labels) for _, labels, _ in groups),
    }
