"""Sensitivity replay: advantages under other parameters from the stored judgments.

No judge is called. A snippet judgment that the new parameters need but the original
run skipped (saturation, or snippets switched off) is unknown: its search turn is
reported as bounded, with credits at the low end, and the sensitivity metrics are the
worse of the two extremes (no match / a match for every positive rubric).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from drcredit.domain.advantages import GroupAdvantages, group_advantages
from drcredit.domain.credit import Judgments, RolloutCredits, group_credits
from drcredit.domain.errors import FieldError, InvalidInput, errors_from_pydantic
from drcredit.domain.group import GroupContent
from drcredit.domain.params import JUDGMENT_PARAMETERS, ScoringParams
from drcredit.domain.sensitivity import Sensitivity, compare, worst_case
from drcredit.scoring.intake.content import outlined_content, params_of
from drcredit.scoring.results.aggregation import judgments_of
from drcredit.scoring.results.documents import require_done
from drcredit.scoring.results.outcomes import group_breakdowns
from drcredit.storage import models as m


@dataclass(frozen=True)
class Replayed:
    """A group's advantages under the reference and the replay's parameters."""

    params: ScoringParams
    reference_params: ScoringParams
    reference: GroupAdvantages
    #: The replay with every unknown snippet judgment at no match (exact when ``bounded`` is empty).
    low: GroupAdvantages
    low_credits: list[RolloutCredits]
    #: With every unknown snippet judgment at a match per positive rubric (None when exact).
    high: GroupAdvantages | None
    bounded: list[tuple[str, int]]


def replay_group(s: Session, group: m.Group, overrides: dict[str, Any]) -> Replayed:
    """Recompute a done group's advantages under ``overrides`` from its stored judgments."""
    require_done(group)
    reference_params = params_of(group)
    merged = {**reference_params.model_dump(mode="json"), **overrides}
    try:
        params = ScoringParams.model_validate(merged)
    except ValidationError as exc:
        # Named as POST /v1/groups names them: the overrides are the body's ``params``.
        raise InvalidInput(
            [
                FieldError(f"params.{e.field}" if e.field else "params", e.message)
                for e in errors_from_pydantic(exc.errors())
            ]
        ) from None
    for name in JUDGMENT_PARAMETERS:
        if getattr(params, name) != getattr(reference_params, name):
            raise InvalidInput(
                [
                    FieldError(
                        f"params.{name}", "changes what the judge is asked; re-post the group instead of replaying"
                    )
                ]
            )
    content = outlined_content(s, group)
    judgments = judgments_of(s, group.id)
    reference = group_advantages(content, group_credits(content, judgments, reference_params), reference_params)
    if params.outcome_source == "judge":
        # The outcome reward under the replay's weights and caps, from the stored
        # outcome judgments (docs/method.md, "Outcome reward").
        rewards = {rid: b.reward for rid, b in group_breakdowns(s, group.id, content.rubrics, params).items()}
        content = content.model_copy(
            update={"rollouts": [r.model_copy(update={"outcome_reward": rewards.get(r.id)}) for r in content.rollouts]}
        )
    low_credits = group_credits(content, judgments, params, allow_missing_snippets=True)
    low = group_advantages(content, low_credits, params)
    bounded = [(rc.rollout_id, t.index) for rc in low_credits for t in rc.turns if t.bounded]
    high = _high_scenario(content, judgments, params, bounded) if bounded else None
    return Replayed(params, reference_params, reference, low, low_credits, high, bounded)


def pooled_sensitivity(replays: Sequence[Replayed]) -> Sensitivity:
    """The sensitivity figures (docs/method.md, "Sensitivity replay") over several groups' turns; with any bounded turn,
    the worse of the low and high scenarios (a bound, not an exact figure)."""
    references = [r.reference for r in replays]
    low = compare(references, [r.low for r in replays])
    if not any(r.bounded for r in replays):
        return low
    return worst_case([low, compare(references, [r.high or r.low for r in replays])])


def replay(s: Session, group: m.Group, overrides: dict[str, Any]) -> dict[str, Any]:
    replayed = replay_group(s, group, overrides)
    return {
        "group_id": group.group_id,
        "status": "done",
        "params": replayed.params.model_dump(mode="json"),
        "reference_params": replayed.reference_params.model_dump(mode="json"),
        "exact": not replayed.bounded,
        "bounded_turns": [{"rollout_id": r, "index": i} for r, i in replayed.bounded],
        "stats": _stats(replayed.low),
        "rollouts": _rollouts(replayed.low, replayed.low_credits),
        "sensitivity": asdict(pooled_sensitivity([replayed])),
    }


def _high_scenario(
    content: GroupContent, judgments: Judgments, params: ScoringParams, bounded: list[tuple[str, int]]
) -> GroupAdvantages:
    filled = dict(judgments.snippet_matches)
    for key in bounded:
        filled[key] = len(content.positive_rubrics)
    credits = group_credits(
        content,
        Judgments(judgments.visit_levels, filled, judgments.failed_visits, judgments.failed_snippets),
        params,
    )
    return group_advantages(content, credits, params)


def _stats(adv: GroupAdvantages) -> dict[str, Any]:
    st = adv.stats
    return {"mu_rg": st.mu_rg, "sigma_rg": st.sigma_rg, "mu_o": st.mu_o, "sigma_o": st.sigma_o}


def _rollouts(adv: GroupAdvantages, credits: list[RolloutCredits]) -> list[dict[str, Any]]:
    out = []
    for ra, rc in zip(adv.rollouts, credits, strict=True):
        turns = []
        for ta, tc in zip(ra.turns, rc.turns, strict=True):
            turn: dict[str, Any] = {
                "index": ta.index,
                "type": ta.type,
                "credit": ta.credit,
                "process_advantage": ta.process_advantage,
                "discounted_process_advantage": ta.discounted_process_advantage,
                "advantage": ta.advantage,
                "unscorable": ta.unscorable,
            }
            if tc.bounded:
                turn["credit_upper_bound"] = tc.credit_upper_bound
            turns.append(turn)
        out.append(
            {
                "id": ra.rollout_id,
                "outcome_reward": ra.outcome_reward,
                "outcome_advantage": ra.outcome_advantage,
                "turns": turns,
            }
        )
    return out
