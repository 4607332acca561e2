"""The in-trainer alternative: Dr.Credit written straight into a trainer with asyncio.

What a trainer author would write: for each group, all (rollout, rubric) visit chains
run concurrently, each chain awaiting its visits in order; every search turn with
unvisited results gets its snippet call once the rollout's visits are all judged; the
credit math reuses this project's pure core, so any difference in wall time or calls
comes from the orchestration alone. No de-duplication, no early saturation decisions.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from drcredit.domain.advantages import GroupAdvantages, group_advantages
from drcredit.domain.credit import Judgments, group_credits, plan_rollout, snippet_decision, visit_credit
from drcredit.domain.group import GroupIn, VisitTurn
from drcredit.domain.verdicts import accept_snippet_matches, validate_visit_answer
from drcredit.judges.base import SnippetJudgeRequest, VisitJudgeRequest, parse_json_answer
from drcredit.judges.openai_judge import DEFAULT_KEEPALIVE_S
from drcredit.judges.prompts import snippet_prompt, visit_prompt


async def _ask(client: AsyncOpenAI, model: str, messages: list[dict[str, str]], limit: asyncio.Semaphore) -> Any:
    async with limit:
        response = await client.chat.completions.create(model=model, messages=messages, temperature=0)  # type: ignore[arg-type]
    return parse_json_answer(response.choices[0].message.content or "")


async def score_group(client: AsyncOpenAI, model: str, group: GroupIn, limit: asyncio.Semaphore) -> GroupAdvantages:
    params = group.params
    levels: dict[tuple[str, int, str], int] = {}
    matches: dict[tuple[str, int], int] = {}

    async def chain(rollout_id: str, rubric_id: str, turns: tuple[int, ...]) -> None:
        rollout = group.rollout(rollout_id)
        rubric = next(r for r in group.rubrics if r.id == rubric_id)
        history: list[str] = []
        for t in turns:
            turn = rollout.turns[t]
            assert isinstance(turn, VisitTurn)
            request = VisitJudgeRequest(group.question, rubric, tuple(history), turn)
            verdict = validate_visit_answer(
                await _ask(client, model, visit_prompt(request).messages, limit), request.usable_page_ids
            )
            levels[(rollout_id, t, rubric_id)] = verdict.level
            if verdict.level:
                history.extend(verdict.support_points)

    async def rollout_work(rollout_index: int) -> None:
        rollout = group.rollouts[rollout_index]
        plan = plan_rollout(group, rollout, params)
        await asyncio.gather(*(chain(c.rollout_id, c.rubric_id, c.turn_indices) for c in plan.chains))
        for t in plan.deterministic_zero_visits:
            for rubric in group.positive_rubrics:
                levels[(rollout.id, t, rubric.id)] = 0
        known = {}
        for t, turn in enumerate(rollout.turns):
            if isinstance(turn, VisitTurn):
                known[t] = visit_credit([levels[(rollout.id, t, r.id)] for r in group.positive_rubrics], params)[0]

        async def snippet(task: Any) -> None:
            if snippet_decision(task, known, params) != "call":
                return
            request = SnippetJudgeRequest(group.question, tuple(group.positive_rubrics), task.eligible)
            verdict = accept_snippet_matches(
                await _ask(client, model, snippet_prompt(request).messages, limit),
                [r.id for r in group.positive_rubrics],
                {r.id: r.snippet for r in task.eligible},
            )
            matches[(rollout.id, task.turn_index)] = len(verdict.accepted)

        await asyncio.gather(*(snippet(task) for task in plan.snippet_tasks))

    await asyncio.gather(*(rollout_work(i) for i in range(len(group.rollouts))))
    judgments = Judgments(levels, matches)
    return group_advantages(group, group_credits(group, judgments, params), params)


async def score_step(
    base_url: str, model: str, groups: list[dict[str, Any]], concurrency: int
) -> list[GroupAdvantages]:
    # The client's default pool keeps 100 idle connections of at most 1,000 for up to 5 s,
    # the judge server's own keep-alive: under 4,096 calls in flight it closed and
    # reopened connections all step, and reused some just as the server dropped them
    # (``ReadError`` four times running for one request). Sized to the concurrency and
    # expiring before the server does, at the platform judge client's keep-alive.
    limits = httpx2.Limits(
        max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=DEFAULT_KEEPALIVE_S
    )
    client = AsyncOpenAI(
        base_url=base_url,
        api_key="EMPTY",
        max_retries=3,
        timeout=600,
        http_client=DefaultAsyncHttpxClient(limits=limits),
    )
    limit = asyncio.Semaphore(concurrency)
    try:
        parsed = [GroupIn.model_validate(g) for g in groups]
        return list(await asyncio.gather(*(score_group(client, model, g, limit) for g in parsed)))
    finally:
        await client.close()


def as_documents(groups: list[dict[str, Any]], results: list[GroupAdvantages]) -> dict[str, Any]:
    out = {}
    for doc, adv in zip(groups, results, strict=True):
        out[doc["group_id"]] = {
            "rollouts": [
                {
                    "id": r.rollout_id,
                    "outcome_advantage": r.outcome_advantage,
                    "turns": [{"index": t.index, "advantage": t.advantage, "credit": t.credit} for t in r.turns],
                }
                for r in adv.rollouts
            ]
        }
    return out


if __name__ == "__main__":  # pragma: no cover - manual use
    import sys

    from bench.workload import make_step

    step = make_step(2, 8)
    res = asyncio.run(score_step(sys.argv[1], "sim", step, 256))
    print(json.dumps(as_documents(step, res))[:500])
