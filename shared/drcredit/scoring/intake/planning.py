"""What ingest writes for arriving rollouts: their turns, their deterministic zeros, their units.

Planning is the pure core's (:func:`drcredit.domain.credit.plan_rollout`); this module
turns a plan into rows, one multi-row statement per table. Every kind of work unit is
born here: one ``visit_chain`` per (rollout, positive rubric), one ``snippet`` per search
turn with eligible results (``waiting`` when saturation may skip it, already ``done``
when it surely does), one ``outcome`` per rollout under ``outcome_source: judge``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from drcredit import metrics
from drcredit.domain.credit import RolloutPlan, snippet_decision
from drcredit.domain.group import GroupContent, GroupIn, Rollout, VisitTurn
from drcredit.domain.outcome import report_facts
from drcredit.domain.outline import outline_turns
from drcredit.scoring.intake.content import Dumped, params_of
from drcredit.scoring.results.outcomes import call_signatures, planned_calls, twin_calls
from drcredit.scoring.work.snippet_release import add_skipped
from drcredit.storage import models as m
from drcredit.storage.bulk import copy_rows
from drcredit.storage.database import utcnow

#: The columns of a new work unit that ingest fills (the rest start empty).
UNIT_COLUMNS = (
    "group_pk",
    "kind",
    "unit_key",
    "rollout_id",
    "rubric_id",
    "turn_index",
    "status",
    "dedupe_turns",
    "payload",
)


@dataclass(frozen=True)
class RolloutToStore:
    """A rollout arriving in a group, with what ingest computed for it."""

    position: int
    rollout: Rollout
    plan: RolloutPlan
    signatures: dict[str, list[int]]
    twins: set[int]


def store_rollouts(
    s: Session, group: m.Group, content: GroupContent, dumped: Dumped, items: Sequence[RolloutToStore]
) -> None:
    """Store rollouts, their turns, deterministic zeros and work units with bulk inserts.

    A batch of groups carries thousands of turns of page text: one multi-row
    statement per table, not one ORM object per row, keeps ingest a fraction of a
    step's critical path.
    """
    if not items:
        return  # a streaming group opened with no rollout yet
    params = params_of(group)
    # The outcome half (docs/method.md, "Outcome reward"): what each report's reward reads, kept at ingest.
    judged = params.outcome_source == "judge"
    facts = {item.rollout.id: report_facts(item.rollout) for item in items} if judged else {}
    # Twins are known exactly when the whole group arrives at once.
    whole = judged and group.rollouts_received == 0 and len(items) == group.expected_rollouts
    outcome_twins = (
        twin_calls({i.rollout.id: call_signatures(i.rollout, facts[i.rollout.id], content.rubrics) for i in items})
        if whole
        else None
    )
    rollout_pks = {
        rollout_id: pk
        for pk, rollout_id in s.execute(
            insert(m.Rollout).returning(m.Rollout.id, m.Rollout.rollout_id),
            [
                {
                    "group_pk": group.id,
                    "position": item.position,
                    "rollout_id": item.rollout.id,
                    "content_hash": dumped.rollout_hash(item.rollout.id),
                    "outcome_reward": item.rollout.outcome_reward,
                    "signatures": item.signatures,
                    "outline": outline_turns(dumped.rollouts[item.rollout.id]["turns"]),
                    "outcome_facts": facts[item.rollout.id].to_json() if facts else None,
                    "arrived_at": utcnow(),
                }
                for item in items
            ],
        )
    }
    turns: list[tuple[int, int, str, dict[str, Any]]] = []
    judgments: list[dict[str, Any]] = []
    units: list[dict[str, Any]] = []
    skipped: list[tuple[int, str, int]] = []
    positive = content.positive_rubrics
    # Units are dispatched in id order: the rollout with the longest chains first.
    for item in sorted(items, key=lambda i: -chain_length(i.rollout)):
        rollout, plan, twins = item.rollout, item.plan, item.twins
        rollout_pk = rollout_pks[rollout.id]
        turns.extend((rollout_pk, i, body["type"], body) for i, body in enumerate(dumped.rollouts[rollout.id]["turns"]))
        judgments.extend(
            {
                "group_pk": group.id,
                "kind": "visit",
                "rollout_id": rollout.id,
                "turn_index": t,
                "rubric_id": rubric.id,
                "status": "deterministic",
                "level": 0,
                "cache_hit": False,
                "attempt_count": 0,
                "attempts": [],
                "created_at": utcnow(),
            }
            for t in plan.deterministic_zero_visits
            for rubric in positive
        )
        units.extend(
            {
                "group_pk": group.id,
                "kind": "visit_chain",
                "unit_key": f"{rollout.id}\x1f{chain.rubric_id}",
                "rollout_id": rollout.id,
                "rubric_id": chain.rubric_id,
                "turn_index": None,
                "status": "queued",
                "dedupe_turns": sorted(twins & set(chain.turn_indices)),
                "payload": None,
            }
            for chain in plan.chains
        )
        known = {t: 0.0 for t in plan.deterministic_zero_visits}
        for task in plan.snippet_tasks:
            decision = snippet_decision(task, known, params)
            units.append(
                {
                    "group_pk": group.id,
                    "kind": "snippet",
                    "unit_key": f"{rollout.id}\x1f{task.turn_index}",
                    "rollout_id": rollout.id,
                    "rubric_id": None,
                    "turn_index": task.turn_index,
                    "status": {"call": "queued", "wait": "waiting", "skip": "done"}[decision],
                    "dedupe_turns": [task.turn_index] if task.turn_index in twins else [],
                    "payload": [r.model_dump(mode="json") for r in task.eligible],
                }
            )
            if decision == "skip":
                skipped.append((group.id, rollout.id, task.turn_index))
        group.judgments_planned += sum(len(c.turn_indices) for c in plan.chains) + len(plan.snippet_tasks)
        outcome_calls = planned_calls(facts[rollout.id], content.rubrics) if judged else []
        if outcome_calls:
            # Calls that may have an identical twin go through the group-wide claim;
            # when the rollouts arrive one by one, any call may (the later ones are
            # not known yet).
            keyed = outcome_twins.get(rollout.id) if outcome_twins is not None else None
            units.append(
                {
                    "group_pk": group.id,
                    "kind": "outcome",
                    "unit_key": f"{rollout.id}\x1foutcome",
                    "rollout_id": rollout.id,
                    "rubric_id": None,
                    "turn_index": None,
                    "status": "queued",
                    "dedupe_turns": keyed if keyed is not None else [f"{k}\x1f{c}" for k, c in outcome_calls],
                    "payload": None,
                }
            )
            group.judgments_planned += len(outcome_calls)
    if turns:
        copy_rows(s, m.Turn.__table__, ("rollout_pk", "index", "type", "body"), turns)  # type: ignore[arg-type]
    if judgments:
        s.connection().execute(insert(m.Judgment), judgments)
        metrics.DETERMINISTIC_ZEROS.inc(len(judgments))
    add_skipped(s, skipped)
    if units:
        stamp = utcnow()
        copy_rows(
            s,
            m.WorkUnit.__table__,  # type: ignore[arg-type]
            (*UNIT_COLUMNS, "attempts", "updated_at"),
            [(*(u[c] for c in UNIT_COLUMNS), 0, stamp) for u in units],
        )
    group.units_total += len(units)
    group.units_done += len(skipped)
    group.rollouts_received += len(items)


def chain_length(rollout: Rollout) -> int:
    """Judge calls of the rollout's visit chains: its visits with a usable page (the others
    are deterministic zeros, no call)."""
    return sum(1 for t in rollout.turns if isinstance(t, VisitTurn) and t.usable_pages)


def longest_chain(group: GroupIn) -> int:
    """The length of the group's longest visit chain (see :func:`chain_length`)."""
    return max((chain_length(r) for r in group.rollouts), default=0)
