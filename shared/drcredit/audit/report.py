"""The audit's report: the two judges' judgments paired, and the training signal compared.

Pairs per kind (docs/method.md, "Judge audit"): visit levels 0-2 by (rollout, turn,
rubric), with the pairs whose history was empty on both sides (identical requests) also
on their own; snippet matches 0/1 by (rollout, search turn, positive rubric) for every
search turn both judges judged; report-rubric scores 0-4 by (rollout, rubric); citation
joint scores 0-2 by (rollout, claim). A key where either side failed is left out, not
paired; a judgment one side never made (a visit without a usable page, a snippet call
skipped as saturated) is neither. Then the process and fused advantages over every
non-final turn, pooled and per group, and with ``outcome_source: judge`` the outcome
rewards' RMSE over the rollouts both judges could score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from drcredit.domain.advantages import GroupAdvantages
from drcredit.domain.agreement import Agreement, Effect, Pair, agreement, effect, rmse
from drcredit.domain.outcome import JOINT

#: The kinds compared and the top of each one's categories (0..top).
KINDS = {"visit": 2, "snippet": 1, "report_rubric": 4, "citation": 2}


@dataclass(frozen=True)
class Side:
    """One judge's view of one group: its judgments and advantages."""

    #: (kind, rollout, turn, key) -> (status, value, matched rubrics, history shown)
    judgments: Mapping[tuple[str, str, int, str], tuple[str, int | None, frozenset[str], int]]
    advantages: GroupAdvantages
    rewards: Mapping[str, float | None]
    #: The judge saw the support history (the group's ``history`` parameter).
    history: bool


@dataclass
class _Pairs:
    pairs: list[Pair]
    left_out: int = 0


def pair_judgments(original: Side, audit: Side, positive_rubrics: Sequence[str]) -> dict[str, tuple[_Pairs, _Pairs]]:
    """Per kind, its pairs and those of the first visits (visits only)."""
    out = {kind: _Pairs([]) for kind in KINDS}
    first = _Pairs([])
    for key, (status, value, matched, shown) in original.judgments.items():
        kind, name = key[0], key[3]
        other = audit.judgments.get(key)
        if other is None or status not in ("ok", "failed"):
            continue
        o_status, o_value, o_matched, o_shown = other
        if kind == "visit":
            empty = (not original.history or shown == 0) and (not audit.history or o_shown == 0)
            bucket = [out["visit"], first] if empty else [out["visit"]]
            for b in bucket:
                if "failed" in (status, o_status):
                    b.left_out += 1
                else:
                    b.pairs.append((value or 0, o_value or 0))
        elif kind == "snippet":
            if "failed" in (status, o_status):
                out["snippet"].left_out += len(positive_rubrics)
            else:
                out["snippet"].pairs += [(int(r in matched), int(r in o_matched)) for r in positive_rubrics]
        elif kind == "rubric":
            _add(out["report_rubric"], status, value, o_status, o_value)
        elif kind == "citation" and name.partition(":")[2] == JOINT:
            _add(out["citation"], status, value, o_status, o_value)
    return {kind: (pairs, first if kind == "visit" else _Pairs([])) for kind, pairs in out.items()}


def _add(into: _Pairs, status: str, value: int | None, o_status: str, o_value: int | None) -> None:
    if "failed" in (status, o_status) or value is None or o_value is None:
        into.left_out += 1
    else:
        into.pairs.append((value, o_value))


def agreement_json(a: Agreement) -> dict[str, Any]:
    """One kind's figures; ``bias`` and ``marginals`` null without a pair."""
    return {
        "pairs": a.pairs,
        "left_out": a.left_out,
        "exact": a.exact,
        "kappa": a.kappa,
        "confusion": a.confusion,
        "bias": a.bias,
        "marginals": asdict(a.marginals) if a.marginals is not None else None,
    }


def effect_json(e: Effect) -> dict[str, Any]:
    return asdict(e)


def with_bias(agreement_doc: Mapping[str, Any]) -> dict[str, Any]:
    """An agreement document with ``bias`` and ``marginals`` for every kind: a report
    stored before they existed gets them from its confusion matrices (they hold every pair)."""
    out: dict[str, Any] = {}
    for kind, figures in agreement_doc.items():
        figures = dict(figures)
        if "bias" not in figures:
            matrix = figures["confusion"]
            pairs = [(i, j) for i, row in enumerate(matrix) for j, n in enumerate(row) for _ in range(n)]
            got = agreement_json(agreement(pairs, len(matrix) - 1))
            figures.update(bias=got["bias"], marginals=got["marginals"])
        if isinstance(figures.get("first_visit"), Mapping):
            figures["first_visit"] = with_bias({"first_visit": figures["first_visit"]})["first_visit"]
        out[kind] = figures
    return out


@dataclass(frozen=True)
class Compared:
    """One audited group: both sides, its positive rubrics, whether the service judged its
    outcome reward."""

    group_id: str
    original: Side
    audit: Side
    positive_rubrics: Sequence[str]
    outcome_judged: bool


def build_report(groups: Sequence[Compared]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(agreement, effect) of the audited groups."""
    pooled = {kind: (_Pairs([]), _Pairs([])) for kind in KINDS}
    per_group = []
    for g in groups:
        group_id, original, audit, positive, outcome_judged = (
            g.group_id,
            g.original,
            g.audit,
            g.positive_rubrics,
            g.outcome_judged,
        )
        for kind, (pairs, first) in pair_judgments(original, audit, positive).items():
            pooled[kind][0].pairs += pairs.pairs
            pooled[kind][0].left_out += pairs.left_out
            pooled[kind][1].pairs += first.pairs
            pooled[kind][1].left_out += first.left_out
        one = effect([original.advantages], [audit.advantages])
        outcome = _outcome_rmse([(original, audit)]) if outcome_judged else None
        per_group.append({"group_id": group_id, **effect_json(one), "outcome_rmse": outcome})
    agreements: dict[str, Any] = {}
    for kind, top in KINDS.items():
        pairs, first = pooled[kind]
        agreements[kind] = agreement_json(agreement(pairs.pairs, top, pairs.left_out))
        if kind == "visit":
            agreements[kind]["first_visit"] = agreement_json(agreement(first.pairs, top, first.left_out))
    pooled_effect = effect([g.original.advantages for g in groups], [g.audit.advantages for g in groups])
    judged = [(g.original, g.audit) for g in groups if g.outcome_judged]
    effect_doc = {
        **effect_json(pooled_effect),
        "outcome_rmse": _outcome_rmse(judged) if judged else None,
        "groups": per_group,
    }
    return agreements, effect_doc


def _outcome_rmse(sides: Sequence[tuple[Side, Side]]) -> float | None:
    """RMSE of the outcome rewards over rollouts both judges could score."""
    pairs = [
        (reward, audit.rewards[rid])
        for original, audit in sides
        for rid, reward in original.rewards.items()
        if reward is not None and audit.rewards.get(rid) is not None
    ]
    return rmse([(a, b) for a, b in pairs if b is not None])
