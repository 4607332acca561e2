"""A training run step by step: what scoring cost and what the credit looked like.

A group belongs to a run and a step through ``metadata.run`` and ``metadata.step`` (the
SDK's ``run``/``step`` arguments and both trainer adapters set them). Per step: groups
and trajectories scored, judge calls per trajectory (process and outcome), the judge's
usage (tokens, cost) in all and per trajectory, failed judgments and unscorable turns,
scoring latency per trajectory (a rollout's arrival to its group's advantages), mean
credit and the share of zero-credit turns, the evidence proxy C(b) and U(b) over the
step's trajectories, the distribution of A_rg, and the judge's levels with their drift
from the run's first steps (:mod:`drcredit.analytics.drift`). Per run: the scoring
workload row (:mod:`drcredit.analytics.workload`) and the drift's baseline.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from drcredit.analytics.drift import levels_by_step, run_drift_section
from drcredit.analytics.evidence import contributions, points
from drcredit.analytics.workload import workload
from drcredit.domain.drift import DEFAULT_DRIFT_THRESHOLD
from drcredit.domain.summaries import ADVANTAGE_EDGES, describe, histogram
from drcredit.domain.usage import JudgePrice, Usage, per_item, total
from drcredit.scoring.errors import NotFound
from drcredit.scoring.results.outcomes import OUTCOME_KINDS
from drcredit.scoring.results.usage import group_usage
from drcredit.storage import models as m
from drcredit.storage.database import aware

PROCESS_KINDS = ("visit", "snippet")


def list_runs(s: Session, tenant: str) -> dict[str, Any]:
    rows = s.execute(
        select(
            m.Group.run,
            func.count(),
            func.count(func.distinct(m.Group.step)),
            func.min(m.Group.created_at),
            func.max(m.Group.created_at),
        )
        .where(m.Group.tenant == tenant, m.Group.run.is_not(None))
        .group_by(m.Group.run)
        .order_by(func.max(m.Group.created_at).desc())
    ).all()
    return {
        "runs": [
            {
                "run": run,
                "groups": groups,
                "steps": steps,
                "first_at": aware(first).isoformat(),
                "last_at": aware(last).isoformat(),
            }
            for run, groups, steps, first, last in rows
        ]
    }


def run_document(
    s: Session,
    tenant: str,
    run: str,
    budgets: Sequence[int],
    price: JudgePrice | None = None,
    drift_threshold: float = DEFAULT_DRIFT_THRESHOLD,
) -> dict[str, Any]:
    """The run's steps and its workload row; costs at ``price`` (null without one); a
    step flagged when its drift is above ``drift_threshold``."""
    groups = s.execute(
        select(m.Group.id, m.Group.group_id, m.Group.step, m.Group.status, m.Group.finished_at, m.Batch.batch_id)
        .outerjoin(m.Batch, m.Batch.id == m.Group.batch_pk)
        .where(m.Group.tenant == tenant, m.Group.run == run)
        .order_by(m.Group.step, m.Group.id)
    ).all()
    if not groups:
        raise NotFound(f"run {run!r} not found", "run")
    done = [g.id for g in groups if g.status == "done"]
    calls = _judge_calls(s, [g.id for g in groups])
    usage = group_usage(s, [g.id for g in groups])
    turns = _turns(s, done)
    arrivals = _arrivals(s, done)
    evidence = contributions(s, done)
    by_step: dict[int | None, list[Any]] = defaultdict(list)
    for g in groups:
        by_step[g.step].append(g)
    numbered = sorted(step for step in by_step if step is not None)
    drift = run_drift_section(levels_by_step(s, tenant, run, numbered), drift_threshold)
    steps = []
    spent: list[Usage] = []
    for step, members in by_step.items():
        finished = [g for g in members if g.status == "done"]
        trajectories = sum(len(arrivals[g.id]) for g in finished)
        process = sum(calls[g.id]["process"] for g in members)
        outcome = sum(calls[g.id]["outcome"] for g in members)
        # Per trajectory: the done groups' calls over their trajectories (a failed
        # group's calls were made, but it scored no trajectory).
        done_process = sum(calls[g.id]["process"] for g in finished)
        done_outcome = sum(calls[g.id]["outcome"] for g in finished)
        step_usage = total(usage[g.id] for g in members)
        spent.append(step_usage)
        credits = [c for g in finished for c, _, _ in turns[g.id] if c is not None]
        advantages = [a for g in finished for _, a, _ in turns[g.id] if a is not None]
        latencies = [
            (aware(g.finished_at) - aware(arrived)).total_seconds()
            for g in finished
            if g.finished_at is not None
            for arrived in arrivals[g.id]
        ]
        steps.append(
            {
                "step": step,
                "groups": len(members),
                "groups_done": len(finished),
                "groups_failed": sum(1 for g in members if g.status == "failed"),
                "batches": sorted({g.batch_id for g in members if g.batch_id is not None}),
                "group_ids": [g.group_id for g in members],
                "trajectories": trajectories,
                "judge_calls": {
                    "process": process,
                    "outcome": outcome,
                    "process_per_trajectory": done_process / trajectories if trajectories else None,
                    "outcome_per_trajectory": done_outcome / trajectories if trajectories else None,
                },
                "usage": step_usage.document(price),
                "usage_per_trajectory": per_item(total(usage[g.id] for g in finished), trajectories, price),
                "failed_judgments": sum(calls[g.id]["failed"] for g in members),
                "unscorable_turns": sum(1 for g in finished for _, _, u in turns[g.id] if u),
                "latency_per_trajectory_s": describe(latencies),
                "mean_credit": sum(credits) / len(credits) if credits else None,
                "zero_credit_share": sum(1 for c in credits if c == 0) / len(credits) if credits else None,
                "evidence": points([u for g in finished for u in evidence[g.id]], budgets),
                "process_advantage": {
                    "summary": describe(advantages),
                    "edges": list(ADVANTAGE_EDGES),
                    "counts": histogram(advantages),
                },
                # A step without a number is not in the run's order: no levels, no drift.
                "judge_levels": drift.judge_levels.get(step) if step is not None else None,
                "drift": drift.drift.get(step) if step is not None else None,
            }
        )
    return {
        "run": run,
        "budgets": list(budgets),
        "workload": workload(steps, total(spent), price),
        "drift_baseline": drift.baseline,
        "steps": steps,
    }


def _judge_calls(s: Session, group_pks: list[int]) -> dict[int, dict[str, int]]:
    """Judge calls actually made (ok or failed, not a reused answer) and failed judgments."""
    out = {pk: {"process": 0, "outcome": 0, "failed": 0} for pk in group_pks}
    if not group_pks:
        return out
    rows = s.execute(
        select(m.Judgment.group_pk, m.Judgment.kind, m.Judgment.status, m.Judgment.cache_hit, func.count())
        .where(m.Judgment.group_pk.in_(group_pks), m.Judgment.status.in_(("ok", "failed")))
        .group_by(m.Judgment.group_pk, m.Judgment.kind, m.Judgment.status, m.Judgment.cache_hit)
    )
    for group_pk, kind, status, cache_hit, count in rows:
        if status == "failed":
            out[group_pk]["failed"] += count
        if cache_hit:
            continue
        if kind in PROCESS_KINDS:
            out[group_pk]["process"] += count
        elif kind in OUTCOME_KINDS:
            out[group_pk]["outcome"] += count
    return out


def _turns(s: Session, group_pks: list[int]) -> dict[int, list[tuple[float | None, float | None, bool]]]:
    """(credit, A_rg, unscorable) of every non-final turn of done groups."""
    out: dict[int, list[tuple[float | None, float | None, bool]]] = {pk: [] for pk in group_pks}
    if not group_pks:
        return out
    rows = s.execute(
        select(m.Rollout.group_pk, m.Turn.credit, m.Turn.process_advantage, m.Turn.unscorable)
        .join(m.Turn, m.Turn.rollout_pk == m.Rollout.id)
        .where(m.Rollout.group_pk.in_(group_pks), m.Turn.type != "answer")
    )
    for group_pk, credit, advantage, unscorable in rows:
        out[group_pk].append((credit, advantage, bool(unscorable)))
    return out


def _arrivals(s: Session, group_pks: list[int]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {pk: [] for pk in group_pks}
    if not group_pks:
        return out
    for group_pk, arrived in s.execute(
        select(m.Rollout.group_pk, m.Rollout.arrived_at).where(m.Rollout.group_pk.in_(group_pks))
    ):
        out[group_pk].append(arrived)
    return out
