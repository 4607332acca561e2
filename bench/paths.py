"""What a step's judge calls must take at least: its longest chain of dependent calls
(the critical-path bound), and the calls a naive scorer would make.

Against judge servers that prefill what they have not cached, a chain's call also waits
for its own prefill: a visit's pages are in no prompt before the first call of that
visit, and that call cannot go out before its rubric's call for the previous visit is
answered. So each visit on a chain adds its latency and the prefill of its own part of
the prompt (:func:`visit_prefill_tokens`) to the chain's time
(:func:`critical_path_seconds`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from drcredit.domain.credit import plan_rollout
from drcredit.domain.group import GroupIn, Rubric, VisitTurn
from drcredit.judges.prompts import PromptLayout, visit_prompt
from drcredit.judges.requests import VisitJudgeRequest

#: Characters a token takes, as the simulated judge counts them.
CHARS_PER_TOKEN = 4


def rollout_critical_path(group: GroupIn, rollout: Any, turns: list[dict[str, Any]]) -> int:
    """A rollout's longest chain of dependent judge calls, from its credits breakdown.

    Its visit chains are as long as its judged visits (every rubric's chain has them
    all); a snippet call that was made waits for the visits whose credit decides its
    saturation, so its depth is the chain position of the last of them plus one.
    """
    return round(_longest_chain(group, rollout, turns, lambda _t, _turn: 1.0, 1.0))


def _longest_chain(
    group: GroupIn,
    rollout: Any,
    turns: list[dict[str, Any]],
    visit_cost: Callable[[int, VisitTurn], float],
    snippet_cost: float,
) -> float:
    """The rollout's longest chain (:func:`rollout_critical_path`), each visit on it
    costing ``visit_cost(turn index, turn)`` and a snippet call that was made
    ``snippet_cost`` after the last visit it waits for."""
    plan = plan_rollout(group, rollout, group.params)
    done_at: dict[int, float] = {}
    elapsed = 0.0
    for t in plan.chains[0].turn_indices if plan.chains else ():
        turn = rollout.turns[t]
        assert isinstance(turn, VisitTurn)
        elapsed += visit_cost(t, turn)
        done_at[t] = elapsed
    longest = elapsed
    for task in plan.snippet_tasks:
        called = any(
            j["kind"] == "snippet" and j["status"] in ("ok", "failed") for j in turns[task.turn_index]["judgments"]
        )
        if called:
            waits = max((done_at.get(v, 0.0) for v in task.navigation_visits), default=0.0)
            longest = max(longest, snippet_cost + waits)
    return longest


def visit_prefill_tokens(question: str, turn: VisitTurn, rubric: Rubric, layout: PromptLayout, block_chars: int) -> int:
    """Tokens a visit's first call must prefill wherever it goes, at the least: the full
    cache blocks inside the visit's own part of the prompt (from its reasoning to its
    last page's evidence). A prefix cache keys each block by everything before it, and
    that part starts with text no other visit has, so no earlier prompt holds them. The
    rubric and its history are left out (the call's own tail, however short), and a
    block is given up at each end of the part, wherever the prompt puts it."""
    prompt = visit_prompt(VisitJudgeRequest(question, rubric, (), turn), layout)
    start = prompt.user.find(orjson.dumps(turn.reasoning).decode())
    pages = turn.usable_pages
    if start < 0 or not pages:
        return 0
    last = orjson.dumps(pages[-1].evidence or "").decode()
    end = prompt.user.rfind(last) + len(last)
    return max(0, (end - start) // block_chars - 1) * (block_chars // CHARS_PER_TOKEN)


def _visit_called(turn: dict[str, Any]) -> bool:
    """Whether a judge call was made for the visit (not every judgment reused or skipped)."""
    return any(
        j["kind"] == "visit" and j["status"] in ("ok", "failed") and not j.get("cache_hit") and not j.get("reused")
        for j in turn["judgments"]
    )


def rollout_critical_seconds(
    group: GroupIn,
    rollout: Any,
    turns: list[dict[str, Any]],
    latency_s: float,
    prefill_s: float,
    layout: PromptLayout,
    block_chars: int,
) -> float:
    """The rollout's longest chain in seconds (:func:`rollout_critical_path` weighted):
    each visit on it one latency and, where the visit was asked of the judge, the prefill
    of its own part; a snippet call one latency after the last visit it waits for."""
    rubric = group.positive_rubrics[0] if group.positive_rubrics else None

    def visit_s(t: int, turn: VisitTurn) -> float:
        own = 0
        if rubric is not None and _visit_called(turns[t]):
            own = visit_prefill_tokens(group.question, turn, rubric, layout, block_chars)
        return latency_s + own * prefill_s

    return _longest_chain(group, rollout, turns, visit_s, latency_s)


def critical_path_seconds(
    groups: list[dict[str, Any]],
    credits: dict[str, Any],
    latency_s: float,
    prefill_s: float,
    layout: PromptLayout,
    block_chars: int = 256,
) -> float:
    """The step's longest chain in seconds, its visits' own prefill included
    (:func:`rollout_critical_seconds`; ``prefill_s``: seconds per uncached token)."""
    return max(
        (
            rollout_critical_seconds(group, rollout, turns, latency_s, prefill_s, layout, block_chars)
            for group, rollout, turns in _rollouts(groups, credits)
        ),
        default=0.0,
    )


def _rollouts(
    groups: list[dict[str, Any]], credits: dict[str, Any]
) -> Iterator[tuple[GroupIn, Any, list[dict[str, Any]]]]:
    """Each rollout of the step with its group and its turns' credits breakdown."""
    for doc in groups:
        group = GroupIn.model_validate(doc)
        breakdown = {r["id"]: r for r in credits[doc["group_id"]]["rollouts"]}
        for rollout in group.rollouts:
            yield group, rollout, breakdown[rollout.id]["turns"]


def critical_path_calls(groups: list[dict[str, Any]], credits: dict[str, Any]) -> int:
    """Longest chain of dependent judge calls in the step (see :func:`rollout_critical_path`)."""
    return max((rollout_critical_path(*each) for each in _rollouts(groups, credits)), default=0)


def naive_calls(groups: list[dict[str, Any]]) -> int:
    """Calls with no deterministic zeros, no saturation skip and no de-duplication."""
    total = 0
    for doc in groups:
        group = GroupIn.model_validate(doc)
        positive = len(group.positive_rubrics)
        for rollout in group.rollouts:
            total += positive * sum(isinstance(t, VisitTurn) for t in rollout.turns)
            total += sum(1 for t in plan_rollout(group, rollout, group.params).snippet_tasks)
    return total


def calls_saved(credits: dict[str, Any]) -> dict[str, int]:
    """Judgments made without a judge call, by reason, from the credits breakdown."""
    saved = {"deterministic_zero": 0, "saturation_skip": 0, "twin_reuse": 0}
    for doc in credits.values():
        for rollout in doc["rollouts"]:
            for turn in rollout["turns"]:
                for j in turn.get("judgments", []):
                    if j["status"] == "deterministic":
                        saved["deterministic_zero"] += 1
                    elif j["status"] == "skipped":
                        saved["saturation_skip"] += 1
                    elif j.get("cache_hit"):
                        saved["twin_reuse"] += 1
    return saved


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
