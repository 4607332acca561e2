"""One group scored again by another judge: its own histories, its own decisions.

The same content and parameters, the same rules as the pipeline (the domain's plan,
saturation decisions, credits, advantages and outcome reward), only the judge differs:
every (rollout, positive rubric) chain asks its visits in order against the support its
own answers gathered, a search's snippet call is made or skipped on the credits this
judge gave, and with ``outcome_source: judge`` the report is judged again. Identical
requests in the group are asked once, as the pipeline does. Every call takes a judge
slot of the process's engine below every training call (:data:`AUDIT_PRIORITY`), so an
audit never delays a step: with slots or an endpoint scarce, training goes first.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from drcredit.audit.spend import AuditSpend
from drcredit.domain.advantages import GroupAdvantages, group_advantages
from drcredit.domain.credit import Judgments, group_credits, plan_rollout, snippet_decision, visit_credit
from drcredit.domain.group import GroupContent, Rollout, VisitTurn
from drcredit.domain.outcome import report_facts, report_of
from drcredit.domain.params import ScoringParams
from drcredit.judges.base import (
    CitationJudgeRequest,
    Judge,
    JudgeResult,
    Prompt,
    RubricJudgeRequest,
    SnippetJudgeRequest,
    VisitJudgeRequest,
)
from drcredit.scoring.priority import PrioritySlots
from drcredit.scoring.results.outcomes import (
    CITATION,
    RUBRIC,
    answer_index,
    breakdown_of,
    citation_call,
    page_evidence,
    planned_calls,
)

#: Added to an audit call's priority (the calls its chain has left): below any training call.
AUDIT_PRIORITY = -1_000_000


@dataclass
class AuditJudgment:
    """One judgment the audit judge made (or failed to make)."""

    kind: str  # visit | snippet | rubric | citation
    rollout_id: str
    turn_index: int
    #: The rubric id (visit, rubric), ``claim:call`` (citation) or "" (snippet).
    key: str
    status: str  # ok | failed
    #: The level (visit), score (rubric, citation) or accepted matches (snippet).
    value: int | None
    #: Snippet: the rubrics it matched.
    matched: list[str] = field(default_factory=list)
    #: Visit: the support points the judge was shown.
    history: int = 0
    failure_reason: str | None = None
    #: Reused from an identical request of the group (no call of its own).
    reused: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class Rescored:
    judgments: list[AuditJudgment]
    advantages: GroupAdvantages
    #: The outcome reward per rollout (None: the trainer's, or unscorable).
    rewards: dict[str, float | None]


class _Asker:
    """Asks the audit judge, each distinct request of the group once."""

    def __init__(self, judge: Judge, slots: PrioritySlots, spend: AuditSpend | None):
        self.judge = judge
        self.slots = slots
        self.spend = spend
        self._asked: dict[str, asyncio.Future[JudgeResult[Any]]] = {}

    async def ask(
        self, prompt: Prompt, call: Callable[[], Awaitable[JudgeResult[Any]]], calls_left: int
    ) -> tuple[JudgeResult[Any], bool]:
        """(result, reused) of the request ``prompt``."""
        key = self.judge.request_key(prompt)
        pending = self._asked.get(key)
        if pending is not None:
            return await asyncio.shield(pending), True
        future: asyncio.Future[JudgeResult[Any]] = asyncio.get_running_loop().create_future()
        self._asked[key] = future
        try:
            async with self.slots.slot(AUDIT_PRIORITY + calls_left):
                result = await call()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: the waiters see it
            raise
        if self.spend is not None:
            self.spend.add(vars(a) for a in result.attempts)
        future.set_result(result)
        return result, False


def _record(
    kind: str, rollout_id: str, turn: int, key: str, result: JudgeResult[Any], reused: bool, **extra: Any
) -> AuditJudgment:
    return AuditJudgment(
        kind,
        rollout_id,
        turn,
        key,
        result.status,
        extra.pop("value", None),
        failure_reason=result.failure_reason,
        reused=reused,
        attempts=[] if reused else [dict(vars(a)) for a in result.attempts],
        **extra,
    )


async def rescore(
    judge: Judge,
    slots: PrioritySlots,
    content: GroupContent,
    params: ScoringParams,
    spend: AuditSpend | None = None,
) -> Rescored:
    """Score ``content`` under ``params`` with ``judge``, adding each call's usage to
    ``spend`` as it is answered. Raises what the judge raises when it cannot be reached
    past its outage deadline."""
    asker = _Asker(judge, slots, spend)
    rollouts = await asyncio.gather(*(_rollout(asker, content, r, params) for r in content.rollouts))
    records = [j for made in rollouts for j in made]
    levels: dict[tuple[str, int, str], int] = {}
    matches: dict[tuple[str, int], int] = {}
    failed_visits: set[tuple[str, int, str]] = set()
    failed_snippets: set[tuple[str, int]] = set()
    outcome: dict[str, dict[tuple[str, str], int | None]] = {r.id: {} for r in content.rollouts}
    for j in records:
        if j.kind == "visit":
            levels[(j.rollout_id, j.turn_index, j.key)] = j.value or 0
            if j.status == "failed":
                failed_visits.add((j.rollout_id, j.turn_index, j.key))
        elif j.kind == "snippet":
            matches[(j.rollout_id, j.turn_index)] = j.value or 0
            if j.status == "failed":
                failed_snippets.add((j.rollout_id, j.turn_index))
        else:
            outcome[j.rollout_id][(j.kind, j.key)] = j.value if j.status == "ok" else None
    for rollout in content.rollouts:
        for t in plan_rollout(content, rollout, params).deterministic_zero_visits:
            for rubric in content.positive_rubrics:
                levels[(rollout.id, t, rubric.id)] = 0
    judgments = Judgments(levels, matches, frozenset(failed_visits), frozenset(failed_snippets))
    credits = group_credits(content, judgments, params)
    rewards: dict[str, float | None] = {r.id: r.outcome_reward for r in content.rollouts}
    scored = content
    if params.outcome_source == "judge":
        rewards = {
            r.id: breakdown_of(report_facts(r), content.rubrics, outcome[r.id], params).reward for r in content.rollouts
        }
        scored = content.model_copy(
            update={"rollouts": [r.model_copy(update={"outcome_reward": rewards[r.id]}) for r in content.rollouts]}
        )
    return Rescored(records, group_advantages(scored, credits, params), rewards)


async def _rollout(
    asker: _Asker, content: GroupContent, rollout: Rollout, params: ScoringParams
) -> list[AuditJudgment]:
    plan = plan_rollout(content, rollout, params)
    rubrics = {r.id: r for r in content.rubrics}
    outcome = (
        asyncio.gather(*_outcome_calls(asker, content, rollout, params)) if params.outcome_source == "judge" else None
    )

    async def chain(rubric_id: str, turns: tuple[int, ...]) -> list[AuditJudgment]:
        history: list[str] = []
        made = []
        for k, t in enumerate(turns):
            turn = rollout.turns[t]
            assert isinstance(turn, VisitTurn)
            shown = tuple(history) if params.history else ()
            request = VisitJudgeRequest(content.question, rubrics[rubric_id], shown, turn)
            prompt = asker.judge.visit_prompt(request)
            result, reused = await asker.ask(
                prompt, functools.partial(asker.judge.ajudge_visit, request, prompt), len(turns) - k
            )
            verdict = result.verdict
            level = verdict.level if result.status == "ok" and verdict is not None else 0
            made.append(_record("visit", rollout.id, t, rubric_id, result, reused, value=level, history=len(shown)))
            if result.status == "ok" and verdict is not None and verdict.level > 0:
                history.extend(verdict.support_points)
        return made

    chains = await asyncio.gather(*(chain(c.rubric_id, c.turn_indices) for c in plan.chains))
    made = [j for c in chains for j in c]
    by_visit: dict[int, list[int]] = {}
    for j in made:
        by_visit.setdefault(j.turn_index, []).append(j.value or 0)
    known = {t: visit_credit(levels, params)[0] for t, levels in by_visit.items()}
    known.update({t: 0.0 for t in plan.deterministic_zero_visits})

    async def snippet(task: Any) -> AuditJudgment | None:
        if snippet_decision(task, known, params) != "call":
            return None
        request = SnippetJudgeRequest(content.question, tuple(content.positive_rubrics), task.eligible)
        prompt = asker.judge.snippet_prompt(request)
        result, reused = await asker.ask(prompt, lambda: asker.judge.ajudge_snippets(request, prompt), 1)
        accepted = result.verdict.accepted if result.status == "ok" and result.verdict is not None else ()
        matched = [m.rubric_id for m in accepted]
        return _record("snippet", rollout.id, task.turn_index, "", result, reused, value=len(matched), matched=matched)

    snippets = await asyncio.gather(*(snippet(task) for task in plan.snippet_tasks))
    made += [j for j in snippets if j is not None]
    if outcome is not None:
        made += await outcome
    return made


def _outcome_calls(
    asker: _Asker, content: GroupContent, rollout: Rollout, params: ScoringParams
) -> list[Awaitable[AuditJudgment]]:
    facts = report_facts(rollout)
    located = report_of(rollout)
    report = located[1] if located is not None else ""
    answer_turn = answer_index(rollout)
    pages = page_evidence(rollout)
    rubrics = {r.id: r for r in content.rubrics}

    async def one(kind: str, key: str) -> AuditJudgment:
        if kind == RUBRIC:
            rubric_request = RubricJudgeRequest(content.question, rubrics[key], report)
            prompt = asker.judge.rubric_prompt(rubric_request)
            result, reused = await asker.ask(prompt, lambda: asker.judge.ajudge_rubric(rubric_request, prompt), 1)
        else:
            citation_request = CitationJudgeRequest(*citation_call(facts, pages, key))
            prompt = asker.judge.citation_prompt(citation_request)
            result, reused = await asker.ask(prompt, lambda: asker.judge.ajudge_citation(citation_request, prompt), 1)
        score = result.verdict.score if result.status == "ok" and result.verdict is not None else None
        return _record(kind, rollout.id, answer_turn, key, result, reused, value=score)

    return [one(kind, key) for kind, key in planned_calls(facts, content.rubrics)]


__all__ = ["AUDIT_PRIORITY", "CITATION", "RUBRIC", "AuditJudgment", "Rescored", "rescore"]
