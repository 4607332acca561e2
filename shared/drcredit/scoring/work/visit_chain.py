"""The ``visit_chain`` work unit: one (rollout, positive rubric) pair's visits, judged in order.

Visit credit is history-aware (docs/method.md, "Visit credit"): each visit is judged against the support
the rubric gathered in the earlier visits of its rollout, so a chain's calls are
sequential and each answer is stored before the next question is asked. To keep the
judge busy anyway, the store of one answer overlaps the next call (its answer is all the
next request needs); the store's outcome is read before the next store, so a chain's
judgments still go in one at a time and in order. A redelivered chain continues from
its last stored judgment; a judgment another delivery stored first (``duplicate``)
makes it re-read where the chain stands.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from drcredit import metrics
from drcredit.domain.credit import calls_on_path
from drcredit.domain.group import GroupContent, Rubric, VisitTurn
from drcredit.domain.params import ScoringParams
from drcredit.domain.verdicts import VisitVerdict
from drcredit.judges.base import JudgeResult, VisitJudgeRequest
from drcredit.scoring.priority import PrioritySlots
from drcredit.scoring.work.unit_context import UnitContext
from drcredit.scoring.work.units import Claimed, Stopping, StoreOutcome, UnitOutcome, Write, judgment_values
from drcredit.storage.bulk import JudgmentRow
from drcredit.storage.database import Database
from drcredit.storage.histories import support_histories
from drcredit.storage.models import Judgment

log = logging.getLogger("drcredit.visit_chain")


async def run_visit_chain(ctx: UnitContext, unit: Claimed, owner: str) -> UnitOutcome:
    metrics.CHAINS_IN_FLIGHT.inc()
    try:
        return await _run(ctx, unit, owner)
    finally:
        metrics.CHAINS_IN_FLIGHT.dec()


async def _run(ctx: UnitContext, unit: Claimed, owner: str) -> UnitOutcome:
    group_pk, params = unit.group_pk, unit.params
    content = await ctx.rollouts.acontent(group_pk, unit.rollout_id)
    rollout = content.rollout(unit.rollout_id)
    rubric = _rubric(content, unit.rubric_id)
    plan = ctx.rollouts.plan(group_pk, content, rollout, params)
    chain = next(c for c in plan.chains if c.rubric_id == rubric.id)
    # Each snippet call's navigation visits, when such a call waits on them: after judging
    # one of these deciders the snippet calls of the rollout are reconsidered.
    navigation = [task.navigation_visits for task in plan.snippet_tasks] if params.skip_saturated_snippets else []
    deciders = {v for visits in navigation for v in visits}
    done, history = set(unit.done), list(unit.history)
    slots = ctx.engine.judge_slots

    async def reread() -> tuple[set[int], list[str]]:
        return await ctx.engine.db(chain_state, ctx.db, group_pk, rollout.id, rubric.id)

    # Until stored, an answer keeps its judge slot: a worker that dies loses at most its
    # judge concurrency in answers, as when the store was awaited first.
    pending: asyncio.Task[StoreOutcome] | None = None
    pending_finishes = False
    # The first call waits its turn behind longer chains (see StartOrder), and goes with
    # the rollout's other rubric chains whose next call is for the same visit.
    first = next((u for u in chain.turn_indices if u not in done), None)
    # The snippet calls that will wait on this chain's visits: a chain that ends on one of
    # them has that call still to come after its own.
    gated = navigation if ctx.snippets.may_wait(group_pk, rollout.id) else []
    await ctx.engine.start_order.wait(
        calls_on_path(chain.turn_indices, done, gated), together=(group_pk, rollout.id, first)
    )
    while True:
        t = next((u for u in chain.turn_indices if u not in done), None)
        if t is None or ctx.stopping.is_set():
            outcome: StoreOutcome = "stored"
            if pending is not None:
                outcome, pending = await pending, None
            if outcome == "lost":
                return "noop"  # the group failed, or another delivery took the unit over
            if outcome == "duplicate":
                done, history = await reread()
                pending_finishes = False
                continue
            if t is not None:
                raise Stopping()
            if not pending_finishes:
                await ctx.writer.put(Write(finish=(unit.unit_id, group_pk)))
            return "done"
        # Calls on the longest path through this chain, this one included: its claim on a slot.
        remaining = calls_on_path(chain.turn_indices, done, gated)
        turn = rollout.turns[t]
        assert isinstance(turn, VisitTurn)
        request = VisitJudgeRequest(
            question=content.question,
            rubric=rubric,
            prior_support=tuple(history) if params.history else (),
            turn=turn,
        )
        prompt = ctx.judge.visit_prompt(request)
        # The request's key finds an identical request's answer: in the group only a turn
        # that can have a twin needs one; in the tenant's reuse store every request.
        key, reuse_key = ctx.judging.keys(ctx.judge, prompt, t in unit.dedupe_turns)
        reuse = (reuse_key, prompt) if reuse_key is not None else None
        release = None
        if t in deciders and ctx.snippets.may_wait(group_pk, rollout.id):
            release = ((group_pk, rollout.id), params)
        # The chain's last judgment finishes the unit in the same transaction (not
        # under the fail policy: a failed judgment must fail the group first).
        last = t == chain.turn_indices[-1] and params.on_judge_failure != "fail"
        store = functools.partial(
            _store_visit,
            ctx,
            group_pk,
            rollout.id,
            rubric.id,
            t,
            len(history),
            key,
            (unit.unit_id, owner),
            release,
            (unit.unit_id, group_pk) if last else None,
        )
        call = functools.partial(ctx.judge.ajudge_visit, request, prompt)
        stored: StoreOutcome
        if key is not None:
            # A request that may have a twin is judged and stored in one step, after
            # the previous store (its answer may be shared with another chain).
            if pending is not None:
                outcome, pending = await pending, None
                if outcome == "lost":
                    return "noop"
                if outcome == "duplicate":
                    done, history = await reread()
                    continue
            async with slots.slot(remaining, (group_pk, rollout.id, t)):
                result, stored = await ctx.judging.once(group_pk, key, "visit", call, store, reuse)
            pending_finishes = last and stored == "stored"
        else:
            await slots.acquire(remaining, (group_pk, rollout.id, t))
            try:
                result = await ctx.judging.call(group_pk, call, reuse)
                previous: StoreOutcome = "stored"
                if pending is not None:
                    previous, pending = await pending, None
            except BaseException:
                slots.release()
                raise
            if previous != "stored":
                slots.release()  # this answer was asked on a history that was not ours
                if previous == "lost":
                    return "noop"
                done, history = await reread()
                pending_finishes = False
                continue
            if result.status == "failed" and params.on_judge_failure == "fail":
                try:
                    stored = await store(result, False)
                finally:
                    slots.release()
            else:
                pending = asyncio.ensure_future(store(result, False))
                pending.add_done_callback(_release_slot(slots))
                pending_finishes = last
                stored = "stored"  # read before the next store (see above)
        if stored == "duplicate":
            done, history = await reread()
            continue
        if stored == "lost":
            return "noop"
        if result.status == "ok" and result.verdict is not None and result.verdict.level > 0:
            history.extend(result.verdict.support_points)
        if result.status == "failed" and params.on_judge_failure == "fail":
            await ctx.engine.db(
                ctx.fail_group,
                group_pk,
                f"visit judgment failed (rollout {rollout.id}, turn {t}, rubric {rubric.id}): {result.failure_reason}",
            )
            return "noop"
        done.add(t)


async def _store_visit(
    ctx: UnitContext,
    group_pk: int,
    rollout_id: str,
    rubric_id: str,
    turn_index: int,
    prior: int,
    key: str | None,
    lease: tuple[int, str],
    release: tuple[tuple[int, str], ScoringParams] | None,
    finish: tuple[int, int] | None,
    result: JudgeResult[VisitVerdict],
    cached: bool,
) -> StoreOutcome:
    """Store one judgment (which extends its rubric's history) and renew the unit's lease, atomically."""
    verdict = result.verdict
    values = judgment_values(group_pk, "visit", rollout_id, turn_index, rubric_id, key, result, cached)
    values["prior_support"] = prior
    if verdict is not None:
        values.update(
            level=verdict.level,
            page_ids=list(verdict.page_ids),
            support_points=list(verdict.support_points),
            rationale=verdict.rationale,
        )
    return await ctx.writer.put(Write(JudgmentRow(values), lease, finish=finish, release=release))


def chain_state(db: Database, group_pk: int, rollout_id: str, rubric_id: str) -> tuple[set[int], list[str]]:
    """Where a chain stands in the database: its judged turns and its support history."""
    with db.session() as s:
        done, history, _ = stored_state(s, {group_pk}, {rollout_id})
    chain = (group_pk, rollout_id, rubric_id)
    return set(done.get(chain, ())), list(history.get(chain, ()))


def stored_state(
    s: Session, group_pks: set[int], rollout_ids: set[str]
) -> tuple[dict[tuple[int, str, str], set[int]], dict[tuple[int, str, str], list[str]], set[tuple[int, str, int]]]:
    """Where the units of these rollouts left off: per (group, rollout, rubric) chain the
    visit turns judged and the support history in order; the snippet turns judged."""
    done: dict[tuple[int, str, str], set[int]] = {}
    snippets_done: set[tuple[int, str, int]] = set()
    for group_pk, kind, rollout_id, turn_index, rubric_id in s.execute(
        select(Judgment.group_pk, Judgment.kind, Judgment.rollout_id, Judgment.turn_index, Judgment.rubric_id).where(
            Judgment.group_pk.in_(group_pks), Judgment.rollout_id.in_(rollout_ids)
        )
    ):
        if kind == "visit":
            done.setdefault((group_pk, rollout_id, rubric_id), set()).add(turn_index)
        elif kind == "snippet":
            snippets_done.add((group_pk, rollout_id, turn_index))
    history = {
        chain: [text for _, text in points] for chain, points in support_histories(s, group_pks, rollout_ids).items()
    }
    return done, history, snippets_done


def _rubric(content: GroupContent, rubric_id: str) -> Rubric:
    for rubric in content.rubrics:
        if rubric.id == rubric_id:
            return rubric
    raise KeyError(rubric_id)


def _release_slot(slots: PrioritySlots) -> Callable[[asyncio.Future[Any]], None]:
    """Done-callback of a pipelined store: give its judge slot back and log a failure
    (the chain that started it may already have ended with another error)."""

    def done(task: asyncio.Future[Any]) -> None:
        slots.release()
        if not task.cancelled() and task.exception() is not None:
            log.warning("storing a judgment failed", exc_info=task.exception())

    return done
