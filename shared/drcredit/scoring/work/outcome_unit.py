"""The ``outcome`` work unit: one rollout's report judged for its outcome reward.

Outcome judgments depend on no support history, so a rollout's unit starts as soon as
the rollout is stored (streamed rollouts included) and runs beside its visit chains. All
its calls (one per rubric with a non-zero weight, the citation calls of its scoreable
claims) go out at once, each under a judge slot; each answer is stored through the
batch writer under the unit's lease; identical requests in the group are
made once. A redelivered unit makes only the calls not stored yet.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from sqlalchemy import select

from drcredit.domain.outcome import report_of
from drcredit.judges.base import CitationJudgeRequest, JudgeResult, RubricJudgeRequest
from drcredit.scoring.results.outcomes import (
    OUTCOME_KINDS,
    RUBRIC,
    answer_index,
    citation_call,
    page_evidence,
    planned_calls,
)
from drcredit.scoring.work.unit_context import UnitContext
from drcredit.scoring.work.units import Claimed, StoreOutcome, UnitOutcome, Write, judgment_values
from drcredit.storage import models as m
from drcredit.storage.bulk import JudgmentRow


async def run_outcome_unit(ctx: UnitContext, unit: Claimed, owner: str) -> UnitOutcome:
    group_pk, params = unit.group_pk, unit.params
    content = await ctx.rollouts.acontent(group_pk, unit.rollout_id)
    rollout = content.rollout(unit.rollout_id)
    facts = unit.facts
    assert facts is not None, "an outcome unit is claimed with its stored report facts"
    done = await ctx.engine.db(_stored_calls, ctx, group_pk, rollout.id) if unit.resumed else set()
    calls = [call for call in planned_calls(facts, content.rubrics) if call not in done]
    located = report_of(rollout)
    report = located[1] if located is not None else ""
    turn_index = answer_index(rollout)
    pages = page_evidence(rollout)
    rubrics = {r.id: r for r in content.rubrics}

    async def one(kind: str, key: str) -> tuple[str, str, JudgeResult[Any], StoreOutcome]:
        # A call no other call waits on: it starts after every visit chain waiting to
        # start (depth 1 in the start order), so a step's outcome calls, hundreds at
        # once, do not delay the first calls of its longest chains, and spread over
        # its slack, so they do not land in one wave on the chains' hops.
        await ctx.engine.start_order.wait(1, spread=True)
        if kind == RUBRIC:
            request: Any = RubricJudgeRequest(content.question, rubrics[key], report)
            prompt = ctx.judge.rubric_prompt(request)
            call = functools.partial(ctx.judge.ajudge_rubric, request, prompt)
        else:
            request = CitationJudgeRequest(*citation_call(facts, pages, key))
            prompt = ctx.judge.citation_prompt(request)
            call = functools.partial(ctx.judge.ajudge_citation, request, prompt)

        async def store(result: JudgeResult[Any], cached: bool) -> StoreOutcome:
            values = judgment_values(group_pk, kind, rollout.id, turn_index, key, prompt_key, result, cached)
            if result.verdict is not None:
                values.update(level=result.verdict.score, rationale=result.verdict.rationale)
            outcome: StoreOutcome = await ctx.writer.put(Write(JudgmentRow(values), (unit.unit_id, owner)))
            return outcome

        # A request with a possible twin (another rollout with the same report, or the
        # same claim on the same pages) is looked up and claimed by its key, group-wide;
        # the others are asked and stored directly.
        twin = f"{kind}\x1f{key}" in unit.twin_calls
        prompt_key, reuse_key = ctx.judging.keys(ctx.judge, prompt, twin)
        reuse = (reuse_key, prompt) if reuse_key is not None else None
        async with ctx.engine.judge_slots.slot(1):
            if prompt_key is not None:
                result, stored = await ctx.judging.once(group_pk, prompt_key, kind, call, store, reuse)
            else:
                result = await ctx.judging.call(group_pk, call, reuse)
                stored = await store(result, False)
        return kind, key, result, stored

    results = await asyncio.gather(*(one(kind, key) for kind, key in calls))
    if any(stored == "lost" for *_, stored in results):
        return "noop"  # the group failed, or another delivery took the unit over
    failed = [(key, r.failure_reason) for kind, key, r, _ in results if kind == RUBRIC and r.status == "failed"]
    if failed and params.on_judge_failure == "fail":
        key, reason = failed[0]
        await ctx.engine.db(
            ctx.fail_group, group_pk, f"rubric judgment failed (rollout {rollout.id}, rubric {key}): {reason}"
        )
        return "noop"
    await ctx.writer.put(Write(finish=(unit.unit_id, group_pk)))
    return "done"


def _stored_calls(ctx: UnitContext, group_pk: int, rollout_id: str) -> set[tuple[str, str]]:
    with ctx.db.session() as s:
        rows = s.execute(
            select(m.Judgment.kind, m.Judgment.rubric_id).where(
                m.Judgment.group_pk == group_pk,
                m.Judgment.rollout_id == rollout_id,
                m.Judgment.kind.in_(OUTCOME_KINDS),
            )
        )
        return {(kind, key) for kind, key in rows}
