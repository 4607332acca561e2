"""The end of a group: credits and advantages from its stored judgments, or its failure.

Aggregation runs once per group, after the exactly-once flip of ``groups.aggregation``
(see :mod:`drcredit.scoring.work.writes`); the group row lock makes a duplicate delivery a
no-op. The math is the pure core's (:mod:`drcredit.domain.credit`,
:mod:`drcredit.domain.advantages`); this module reads its inputs and stores its results.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from drcredit import metrics
from drcredit.domain.advantages import GroupAdvantages, group_advantages
from drcredit.domain.credit import Judgments, RolloutCredits, group_credits
from drcredit.domain.group import GroupContent
from drcredit.domain.usage import JudgePrice
from drcredit.scoring.intake.content import outlined_rollouts, parse_rubrics
from drcredit.scoring.results import documents
from drcredit.scoring.results.events import GroupEvents, announce_final
from drcredit.scoring.results.outcomes import breakdown_json, group_breakdowns
from drcredit.scoring.results.usage import record_tenant_usage
from drcredit.scoring.work.rollout_cache import RolloutCache
from drcredit.storage import models as m
from drcredit.storage import repository as repo
from drcredit.storage.database import Database, aware, rows_changed, utcnow
from drcredit.tenancy.windows import bucket

log = logging.getLogger("drcredit.aggregation")


class Aggregator:
    """Finishes groups: :meth:`run` when every unit is done, :meth:`fail` on a fatal failure."""

    def __init__(
        self,
        db: Database,
        rollouts: RolloutCache,
        events: GroupEvents,
        price: JudgePrice | None = None,
        budget_window_s: float | None = None,
    ):
        self.db = db
        self.rollouts = rollouts
        self.events = events
        #: The judge's price when the group is finished: its stored document's ``cost_usd``.
        self.price = price
        #: Test budget windows (``DRCREDIT_BUDGET_WINDOW_S``): the tenant ledger's buckets.
        self.budget_window_s = budget_window_s

    def run(self, group_pk: int) -> None:
        """Compute and store credits and advantages once every judgment is in."""
        with self.db.session() as s:
            # The row lock serializes duplicate deliveries; the second finds it done.
            group = repo.group_for_aggregation(s, group_pk)
            if group is None or group.status not in ("queued", "running") or group.aggregation == "done":
                return
            params = self.rollouts.params(group_pk, group.params)
            # Outlines, not turn bodies: credits read the rollouts' shape only.
            outlined = outlined_rollouts(s, group_pk)
            breakdowns = (
                group_breakdowns(s, group_pk, parse_rubrics(group.rubrics), params)
                if params.outcome_source == "judge"
                else {}
            )
            for _, doc in outlined:
                if doc["id"] in breakdowns:
                    doc["outcome_reward"] = breakdowns[doc["id"]].reward
            content = GroupContent.model_validate(
                {"question": group.question, "rubrics": group.rubrics, "rollouts": [doc for _, doc in outlined]}
            )
            judgments = judgments_of(s, group_pk)
            try:
                credits = group_credits(content, judgments, params)
                advantages = group_advantages(content, credits, params)
            except Exception as exc:
                log.exception("aggregation of group %s failed", group_pk)
                stamp = utcnow()
                repo.finish_group(s, group_pk, None, f"aggregation failed: {type(exc).__name__}: {exc}", stamp)
                failed = True
            else:
                failed = False
                rollout_pks = {doc["id"]: pk for pk, doc in outlined}
                turn_pks = repo.turn_ids(s, rollout_pks.values())
                outcomes = [(rollout_pks[rid], b.reward, breakdown_json(b)) for rid, b in breakdowns.items()]
                repo.store_results(s, *result_rows(rollout_pks, turn_pks, credits, advantages), outcomes)
                st = advantages.stats
                stats = {
                    "mu_rg": st.mu_rg,
                    "sigma_rg": st.sigma_rg,
                    "mu_o": st.mu_o,
                    "sigma_o": st.sigma_o,
                    "research_turns": st.research_turns,
                    "unscorable_turns": st.unscorable_turns,
                }
                # The document a long-poll serves, built from the rows just written.
                document = documents.done_advantages_json(s, group_pk, stats, self.price)
                # Stamped last, just before the commit: finished_at is when the group's
                # results became visible (what a long-poll's latency is measured from).
                stamp = utcnow()
                repo.finish_group(s, group_pk, stats, None, stamp, document)
            record_tenant_usage(s, group_pk, bucket(stamp, self.budget_window_s))
            announce_final(s, group_pk)
        self.events.finished([group_pk])
        metrics.GROUPS_FINISHED.labels("failed" if failed else "done").inc()
        if not failed:
            metrics.GROUP_LATENCY.observe((stamp - aware(group.created_at)).total_seconds())
            log.info("group done", extra={"group_pk": group_pk})

    def fail(self, group_pk: int, reason: str) -> None:
        """Fail an open group with ``reason`` and cancel its remaining units."""
        with self.db.session() as s:
            changed = rows_changed(
                s,
                update(m.Group)
                .where(m.Group.id == group_pk, m.Group.status.in_(("queued", "running")))
                .values(status="failed", error=reason, finished_at=utcnow()),
            )
            if changed:
                s.execute(
                    update(m.WorkUnit)
                    .where(m.WorkUnit.group_pk == group_pk, m.WorkUnit.status.in_(("queued", "running", "waiting")))
                    .values(status="cancelled", lease_owner=None, lease_expires_at=None)
                )
                record_tenant_usage(s, group_pk, bucket(utcnow(), self.budget_window_s))
                announce_final(s, group_pk)
        if changed:
            self.events.finished([group_pk])
            metrics.GROUPS_FINISHED.labels("failed").inc()
            log.warning("group failed: %s", reason, extra={"group_pk": group_pk})


def judgments_of(s: Session, group_pk: int) -> Judgments:
    """The stored ordinal judgments of a group, as the credit math reads them."""
    visit: dict[tuple[str, int, str], int] = {}
    snippet: dict[tuple[str, int], int] = {}
    failed_visits: set[tuple[str, int, str]] = set()
    failed_snippets: set[tuple[str, int]] = set()
    for kind, rollout_id, turn_index, rubric_id, status, level, count in repo.judgment_outcomes(s, group_pk):
        if kind == "visit":
            visit[(rollout_id, turn_index, rubric_id)] = (level or 0) if status in ("ok", "deterministic") else 0
            if status == "failed":
                failed_visits.add((rollout_id, turn_index, rubric_id))
        elif kind == "snippet" and status in ("ok", "failed"):
            snippet[(rollout_id, turn_index)] = (count or 0) if status == "ok" else 0
            if status == "failed":
                failed_snippets.add((rollout_id, turn_index))
    return Judgments(visit, snippet, frozenset(failed_visits), frozenset(failed_snippets))


def result_rows(
    rollout_pks: dict[str, int],
    turn_pks: dict[int, list[int]],
    credits: list[RolloutCredits],
    advantages: GroupAdvantages,
) -> tuple[list[tuple[int, tuple[Any, ...]]], list[tuple[int, float]]]:
    """Aggregation's results as rows for :func:`drcredit.storage.repository.store_results`."""
    turn_rows: list[tuple[int, tuple[Any, ...]]] = []
    rollout_rows: list[tuple[int, float]] = []
    for rc, ra in zip(credits, advantages.rollouts, strict=True):
        rollout_pk = rollout_pks[rc.rollout_id]
        rollout_rows.append((rollout_pk, ra.outcome_advantage))
        for turn_pk, tc, ta in zip(turn_pks.get(rollout_pk, []), rc.turns, ra.turns, strict=True):
            values = (
                ta.credit,
                tc.visit_credit,
                tc.visit_credit_uncapped,
                tc.navigation_credit,
                tc.snippet_credit,
                tc.snippet_matches,
                ta.process_advantage,
                ta.discounted_process_advantage,
                ta.advantage,
                ta.unscorable,
            )
            turn_rows.append((turn_pk, values))
    return turn_rows, rollout_rows
