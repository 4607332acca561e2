"""The ``snippet`` work unit: one search turn's unvisited results matched against the rubrics.

One call per search turn with eligible results (docs/method.md, "Search credit"). Storing its answer
finishes the unit in the same transaction, unless the failure policy is ``fail`` (a
failed judgment must fail the group first). A unit may start ``waiting`` for the visits
that decide whether it is needed (:mod:`drcredit.scoring.work.snippet_release`).
"""

from __future__ import annotations

import functools

from drcredit.domain.verdicts import SnippetVerdict
from drcredit.judges.base import JudgeResult, SnippetJudgeRequest
from drcredit.scoring.work.unit_context import UnitContext
from drcredit.scoring.work.units import Claimed, StoreOutcome, UnitOutcome, Write, judgment_values
from drcredit.storage.bulk import JudgmentRow


async def run_snippet(ctx: UnitContext, unit: Claimed, owner: str) -> UnitOutcome:
    group_pk, params = unit.group_pk, unit.params
    if not unit.snippet_done:
        # One call, the last of its path: it starts after the visit chains waiting to
        # start (depth 1 in the start order).
        await ctx.engine.start_order.wait(1)
        request = await _request(ctx, unit)
        prompt = ctx.judge.snippet_prompt(request)
        key, reuse_key = ctx.judging.keys(ctx.judge, prompt, bool(unit.dedupe_turns))
        reuse = (reuse_key, prompt) if reuse_key is not None else None
        call = functools.partial(ctx.judge.ajudge_snippets, request, prompt)
        fails_group = params.on_judge_failure == "fail"
        store = functools.partial(
            _store_snippet,
            ctx,
            group_pk,
            unit.rollout_id,
            unit.turn_index,
            key,
            None if fails_group else (unit.unit_id, group_pk),
        )
        async with ctx.engine.judge_slots.slot(1):
            if key is not None:
                result, stored = await ctx.judging.once(group_pk, key, "snippet", call, store, reuse)
            else:
                result = await ctx.judging.call(group_pk, call, reuse)
                stored = await store(result, False)
        if result.status == "failed" and fails_group:
            await ctx.engine.db(
                ctx.fail_group,
                group_pk,
                f"snippet judgment failed (rollout {unit.rollout_id}, turn {unit.turn_index}): {result.failure_reason}",
            )
            return "noop"
        if stored == "stored" and not fails_group:
            return "done"
    await ctx.writer.put(Write(finish=(unit.unit_id, group_pk)))
    return "done"


async def _request(ctx: UnitContext, unit: Claimed) -> SnippetJudgeRequest:
    """From the unit's stored results and the group's header; the rollout only for a
    unit stored before snippet calls carried their results."""
    header = ctx.rollouts.header(unit.group_pk)
    if unit.payload is not None and header is not None:
        question, rubrics = header
        return SnippetJudgeRequest(question, rubrics, unit.payload)
    content = await ctx.rollouts.acontent(unit.group_pk, unit.rollout_id)
    rollout = content.rollout(unit.rollout_id)
    plan = ctx.rollouts.plan(unit.group_pk, content, rollout, unit.params)
    task = next(t for t in plan.snippet_tasks if t.turn_index == unit.turn_index)
    return SnippetJudgeRequest(content.question, tuple(content.positive_rubrics), task.eligible)


async def _store_snippet(
    ctx: UnitContext,
    group_pk: int,
    rollout_id: str,
    turn_index: int,
    key: str | None,
    finish: tuple[int, int] | None,
    result: JudgeResult[SnippetVerdict],
    cached: bool,
) -> StoreOutcome:
    values = judgment_values(group_pk, "snippet", rollout_id, turn_index, "", key, result, cached)
    verdict = result.verdict
    if verdict is not None:
        values.update(
            matches=[vars(x) for x in verdict.accepted],
            rejected_matches=[{"index": x.index, "match": x.raw, "reason": x.reason} for x in verdict.rejected],
            match_count=len(verdict.accepted),
        )
    return await ctx.writer.put(Write(JudgmentRow(values), finish=finish))
