"""A group's evidence proxy (docs/method.md, "Evidence proxy") from its stored per-turn credits."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from drcredit.domain.errors import FieldError, InvalidInput
from drcredit.domain.evidence import DEFAULT_BUDGETS, RESEARCH_TYPES, contribution, evidence_curve
from drcredit.domain.params import ScoringParams
from drcredit.scoring.results.documents import require_done
from drcredit.storage import models as m

#: Budgets one request may ask for.
MAX_BUDGETS = 64
MAX_BUDGET = 100_000


def parse_budgets(raw: str | None) -> tuple[int, ...]:
    """``"2,4,8"`` as budgets (the paper's 2..14 when absent); a 422 naming the value otherwise."""
    if raw is None or raw.strip() == "":
        return DEFAULT_BUDGETS
    try:
        budgets = tuple(int(part) for part in raw.split(","))
    except ValueError:
        raise InvalidInput([FieldError("budgets", f"must be comma-separated integers, got {raw[:60]!r}")]) from None
    if not budgets or len(budgets) > MAX_BUDGETS or any(not 1 <= b <= MAX_BUDGET for b in budgets):
        raise InvalidInput(
            [FieldError("budgets", f"must be 1 to {MAX_BUDGETS} integers from 1 to {MAX_BUDGET}, got {raw[:60]!r}")]
        )
    return budgets


def contributions(s: Session, group_pks: Iterable[int]) -> dict[int, list[list[float]]]:
    """Per group, each rollout's ``u`` over its research turns in order."""
    pks = list(group_pks)
    if not pks:
        return {}
    # Only the parameters of each group (eta), not its rubrics and metadata.
    eta = {
        pk: ScoringParams.model_validate(params).snippet_weight
        for pk, params in s.execute(select(m.Group.id, m.Group.params).where(m.Group.id.in_(pks)))
    }
    rows = s.execute(
        select(m.Rollout.group_pk, m.Rollout.id, m.Turn.type, m.Turn.visit_credit_uncapped, m.Turn.snippet_matches)
        .join(m.Turn, m.Turn.rollout_pk == m.Rollout.id)
        .where(m.Rollout.group_pk.in_(pks), m.Turn.type.in_(RESEARCH_TYPES))
        .order_by(m.Rollout.group_pk, m.Rollout.position, m.Turn.index)
    )
    out: dict[int, dict[int, list[float]]] = {pk: {} for pk in pks}
    for group_pk, rollout_pk, turn_type, uncapped, matches in rows:
        out[group_pk].setdefault(rollout_pk, []).append(contribution(turn_type, uncapped, matches, eta[group_pk]))
    return {pk: list(by_rollout.values()) for pk, by_rollout in out.items()}


def points(per_rollout: Sequence[Sequence[float]], budgets: Sequence[int]) -> list[dict[str, Any]]:
    return [asdict(p) for p in evidence_curve(per_rollout, budgets)]


def evidence_document(s: Session, group: m.Group, budgets: Sequence[int]) -> dict[str, Any]:
    require_done(group)
    per_rollout = contributions(s, [group.id])[group.id]
    return {"group_id": group.group_id, "status": group.status, "points": points(per_rollout, budgets)}
