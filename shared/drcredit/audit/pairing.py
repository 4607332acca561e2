"""A run's groups: each sampled group loaded with the original judge's side, paired with
the audit judge's re-scoring, and what the run stores of it (judgments, advantages,
usage)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from drcredit.audit.report import Compared, Side
from drcredit.audit.rescore import Rescored
from drcredit.audit.spend import attempts_usage
from drcredit.domain.advantages import group_advantages
from drcredit.domain.credit import group_credits
from drcredit.domain.group import GroupContent
from drcredit.domain.usage import Usage
from drcredit.scoring.errors import NotFound
from drcredit.scoring.intake.content import outlined_content, params_of
from drcredit.scoring.results.aggregation import judgments_of
from drcredit.scoring.results.outcomes import group_breakdowns
from drcredit.storage import models as m
from drcredit.storage import repository as repo

Loaded = tuple[m.Group, GroupContent, Any, Side]


def load_group(s: Session, tenant: str, group_id: str) -> Loaded:
    """A sampled group: its row, full content, parameters and the original judge's side."""
    group = s.scalar(select(m.Group).where(m.Group.tenant == tenant, m.Group.group_id == group_id))
    if group is None or group.status != "done":
        raise NotFound(f"group {group_id!r} is no longer a done group of this tenant")
    params = params_of(group)
    ids = list(
        s.scalars(select(m.Rollout.rollout_id).where(m.Rollout.group_pk == group.id).order_by(m.Rollout.position))
    )
    documents = repo.rollout_documents(s, group.id, ids)
    content = GroupContent.model_validate(
        {
            "question": group.question,
            "rubrics": group.rubrics,
            "rollouts": [documents[rid]["rollouts"][0] for rid in ids],
        }
    )
    outline = outlined_content(s, group)
    credits = group_credits(outline, judgments_of(s, group.id), params)
    rewards: dict[str, float | None] = {r.id: r.outcome_reward for r in outline.rollouts}
    if params.outcome_source == "judge":
        rewards = {rid: b.reward for rid, b in group_breakdowns(s, group.id, outline.rubrics, params).items()}
        outline = outline.model_copy(
            update={"rollouts": [r.model_copy(update={"outcome_reward": rewards.get(r.id)}) for r in outline.rollouts]}
        )
    judged: dict[tuple[str, str, int, str], tuple[str, int | None, frozenset[str], int]] = {}
    rows = s.execute(
        select(
            m.Judgment.kind,
            m.Judgment.rollout_id,
            m.Judgment.turn_index,
            m.Judgment.rubric_id,
            m.Judgment.status,
            m.Judgment.level,
            m.Judgment.match_count,
            m.Judgment.matches,
            m.Judgment.prior_support,
        ).where(m.Judgment.group_pk == group.id)
    )
    for kind, rollout_id, turn, key, status, level, count, matches, prior in rows:
        matched = frozenset(x["rubric_id"] for x in matches or ())
        value = count if kind == "snippet" else level
        judged[(kind, rollout_id, turn, key)] = (status, value, matched, prior or 0)
    side = Side(judged, group_advantages(outline, credits, params), rewards, params.history)
    return group, content, params, side


def compare(loaded: list[Loaded], results: list[Rescored]) -> tuple[list[Compared], dict[int, dict[str, Any]]]:
    """Each group's two sides for the report, and per group row what the audit stores of it."""
    compared = []
    stored: dict[int, dict[str, Any]] = {}
    for (group, content, params, original), result in zip(loaded, results, strict=True):
        judged = {
            (j.kind, j.rollout_id, j.turn_index, j.key): (j.status, j.value, frozenset(j.matched), j.history)
            for j in result.judgments
        }
        audit = Side(judged, result.advantages, result.rewards, params.history)
        positive = [r.id for r in content.positive_rubrics]
        compared.append(Compared(group.group_id, original, audit, positive, params.outcome_source == "judge"))
        stored[group.id] = {
            "judgments": [j.as_json() for j in result.judgments],
            "advantages": _advantages_json(result),
            "usage": usage_json([result], None),
        }
    return compared, stored


def _advantages_json(result: Rescored) -> dict[str, Any]:
    return {
        "rollouts": [
            {
                "id": r.rollout_id,
                "outcome_reward": result.rewards.get(r.rollout_id),
                "outcome_advantage": r.outcome_advantage,
                "turns": [
                    {
                        "index": t.index,
                        "credit": t.credit,
                        "process_advantage": t.process_advantage,
                        "advantage": t.advantage,
                    }
                    for t in r.turns
                ],
            }
            for r in result.advantages.rollouts
        ]
    }


def usage_json(results: list[Rescored], seconds: float | None) -> dict[str, Any]:
    """The report's ``usage``: every attempt's calls and tokens (``seconds``: the run's length)."""
    total = Usage()
    for r in results:
        for j in r.judgments:
            total = total + attempts_usage(j.attempts)
    usage: dict[str, Any] = {
        "calls": total.calls,
        "judgments": sum(1 for r in results for j in r.judgments if not j.reused),
        "prompt_tokens": total.prompt_tokens,
        "completion_tokens": total.completion_tokens,
        "cached_prompt_tokens": total.cached_prompt_tokens,
    }
    if seconds is not None:
        usage["seconds"] = round(seconds, 3)
    return usage
