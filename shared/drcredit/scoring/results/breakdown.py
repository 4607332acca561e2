"""The credits breakdown: what each turn's credit rests on.

Per turn its credit parts and every judgment (level, support points, matches, who
answered it and what it cost in tokens, each attempt), and each rubric's support history.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from drcredit.scoring.results.documents import require_done
from drcredit.storage import models as m
from drcredit.storage.histories import support_histories


def credits_document(s: Session, group: m.Group) -> dict[str, Any]:
    """Per turn: the credit parts, every judgment, and each rubric's support history.

    A failed group has one too, without credits: what was judged, and why it failed.
    """
    if group.status != "failed":
        require_done(group)
    judgments = s.scalars(
        select(m.Judgment)
        .where(m.Judgment.group_pk == group.id)
        .order_by(m.Judgment.rollout_id, m.Judgment.turn_index, m.Judgment.rubric_id)
    ).all()
    by_turn: dict[tuple[str, int], list[m.Judgment]] = {}
    for j in judgments:
        by_turn.setdefault((j.rollout_id, j.turn_index), []).append(j)
    histories: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for (_, rollout_id, rubric_id), points in sorted(support_histories(s, [group.id]).items()):
        histories.setdefault(rollout_id, {})[rubric_id] = [{"turn_index": t, "text": text} for t, text in points]
    rollouts = []
    for r in group.rollouts:
        turns = []
        for t in r.turns:
            entry: dict[str, Any] = {
                "index": t.index,
                "type": t.type,
                "credit": None if t.type == "answer" else t.credit,
                "unscorable": bool(t.unscorable),
            }
            if t.type == "visit":
                entry.update(visit_credit=t.visit_credit, visit_credit_uncapped=t.visit_credit_uncapped)
            if t.type == "search":
                entry.update(
                    navigation_credit=t.navigation_credit,
                    snippet_credit=t.snippet_credit,
                    snippet_matches=t.snippet_matches,
                )
            entry["judgments"] = [_judgment(j) for j in by_turn.get((r.rollout_id, t.index), [])]
            turns.append(entry)
        entry = {"id": r.rollout_id, "turns": turns, "support_histories": histories.get(r.rollout_id, {})}
        if r.outcome is not None:  # outcome_source judge: the reward's breakdown (docs/method.md, "Outcome reward")
            entry["outcome"] = r.outcome
        rollouts.append(entry)
    return {
        "group_id": group.group_id,
        "status": group.status,
        "error": group.error,
        "params": group.params,
        "rubrics": [
            {"id": r["id"], "type": r.get("type"), "weight": r.get("weight"), "description": r.get("description")}
            for r in group.rubrics
        ],
        "rollouts": rollouts,
    }


def _judgment(j: m.Judgment) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": j.kind, "status": j.status}
    if j.kind in ("rubric", "citation"):
        out.update(key=j.rubric_id, score=j.level)
    elif j.kind == "visit":
        out.update(
            rubric_id=j.rubric_id,
            level=j.level,
            page_ids=j.page_ids or [],
            support_points=j.support_points or [],
            prior_support_points=j.prior_support,
        )
    else:
        out.update(match_count=j.match_count, matches=j.matches or [], rejected_matches=j.rejected_matches or [])
    out.update(
        rationale=j.rationale,
        failure_reason=j.failure_reason,
        cache_hit=j.cache_hit,
        reused=j.reused,
        prompt_layout=j.prompt_layout,
        model=j.model,
        served_model=j.served_model,
        endpoint=j.endpoint,
        latency_s=j.latency_s,
        prompt_tokens=j.prompt_tokens,
        completion_tokens=j.completion_tokens,
        cached_prompt_tokens=j.cached_prompt_tokens,
        estimated_prompt_tokens=j.estimated_prompt_tokens,
        attempts=[_attempt(a) for a in j.attempts or ()],
    )
    return out


def _attempt(a: dict[str, Any]) -> dict[str, Any]:
    """One stored attempt; what attempts stored before a field existed lack reads as its default."""
    return {
        "number": a["number"],
        "outcome": a["outcome"],
        "error": a.get("error"),
        "latency_s": a.get("latency_s"),
        "prompt_tokens": a.get("prompt_tokens", 0),
        "completion_tokens": a.get("completion_tokens", 0),
        "cached_tokens": a.get("cached_tokens", 0),
        "estimated": a.get("estimated", False),
        "endpoint": a.get("endpoint"),
        "model": a.get("model"),
        "finish_reason": a.get("finish_reason"),
        "spent": a.get("spent", True),
        "waited_s": a.get("waited_s", 0.0),
    }
