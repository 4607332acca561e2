"""Snippet calls that wait on visits: decided once the visits they depend on are judged.

With ``skip_saturated_snippets`` (docs/method.md, "Search credit") a search turn's snippet call is skipped
when navigation credit already fills the turn's cap. That credit is known only once the
visits of the turn's URLs are judged, so such a call is stored ``waiting`` at ingest and
decided here, in the transaction that stores the deciding judgment (or by a sweep): it is
queued for the judge, or recorded as skipped and counted done.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from drcredit import metrics
from drcredit.domain.credit import snippet_decision, visit_credit
from drcredit.domain.params import ScoringParams
from drcredit.scoring.dispatch import Dispatcher, UnitRef
from drcredit.scoring.work.rollout_cache import RolloutCache
from drcredit.storage import repository as repo
from drcredit.storage.bulk import JudgmentRow, store_judgments
from drcredit.storage.database import Database, utcnow


class SnippetRelease:
    """Queue or skip waiting snippet calls; remembers rollouts with none left waiting."""

    def __init__(self, db: Database, dispatcher: Dispatcher, rollouts: RolloutCache):
        self.db = db
        self.dispatcher = dispatcher
        self.rollouts = rollouts
        #: Rollouts with no waiting snippet call left (units never return to waiting).
        self._none_waiting: set[tuple[int, str]] = set()

    def may_wait(self, group_pk: int, rollout_id: str) -> bool:
        """Whether the rollout may still have a waiting snippet call (as far as this process knows)."""
        return (group_pk, rollout_id) not in self._none_waiting

    def release(self, group_pk: int, rollout_id: str) -> None:
        """Decide, in a transaction of its own, the waiting snippet calls of a rollout."""
        if not self.may_wait(group_pk, rollout_id):
            return
        with self.db.session() as s:
            stamp = utcnow()
            repo.lock_groups(s, {group_pk})
            to_dispatch, done = self.decide(s, {(group_pk, rollout_id): None}, stamp)
            repo.add_units_done(s, done, stamp)
            flipped = repo.flip_aggregation(s, set(done), stamp)
        if to_dispatch:
            self.dispatcher.dispatch(to_dispatch)
        for pk in flipped:
            self.dispatcher.dispatch_aggregation(pk)

    def decide(
        self, s: Session, rollouts: Mapping[tuple[int, str], ScoringParams | None], stamp: datetime
    ) -> tuple[list[UnitRef], Counter[int]]:
        """Queue or skip, in ``s``, the waiting snippet calls whose navigation visits are all judged.

        ``rollouts`` maps (group, rollout) to the group's params when the caller knows
        them (a chain does), else None. Returns the units to dispatch after commit and
        the units finished by a skip, per group (their counts are the caller's to add).
        The caller holds the groups' row locks.
        """
        pairs = [p for p in rollouts if p not in self._none_waiting]
        if not pairs:
            return [], Counter()
        waiting: dict[tuple[int, str], list[tuple[int, int]]] = {}
        for unit_id, group_pk, rollout_id, turn_index in repo.waiting_snippets(s, pairs):
            waiting.setdefault((group_pk, rollout_id), []).append((unit_id, turn_index))
        for pair in pairs:
            if pair not in waiting:
                if len(self._none_waiting) > 100_000:
                    self._none_waiting.clear()
                self._none_waiting.add(pair)
        if not waiting:
            return [], Counter()
        levels: dict[tuple[int, str], dict[int, list[int]]] = {}
        for group_pk, rollout_id, turn_index, level in repo.visit_levels(s, waiting):
            levels.setdefault((group_pk, rollout_id), {}).setdefault(turn_index, []).append(level or 0)
        targets: dict[int, str] = {}
        units_of: dict[int, tuple[int, str, int]] = {}
        for (group_pk, rollout_id), units in waiting.items():
            known_params = rollouts[(group_pk, rollout_id)]
            params = (
                known_params
                if known_params is not None
                else self.rollouts.params(group_pk, repo.group_states(s, {group_pk})[group_pk][1])
            )
            content = self.rollouts.content(group_pk, rollout_id, session=s)
            rollout = content.rollout(rollout_id)
            plan = self.rollouts.plan(group_pk, content, rollout, params)
            n_rubrics = len(content.positive_rubrics)
            known = {
                t: visit_credit(v, params)[0]
                for t, v in levels.get((group_pk, rollout_id), {}).items()
                if len(v) == n_rubrics
            }
            tasks = {t.turn_index: t for t in plan.snippet_tasks}
            for unit_id, turn_index in units:
                decision = snippet_decision(tasks[turn_index], known, params)
                if decision != "wait":
                    targets[unit_id] = "queued" if decision == "call" else "done"
                    units_of[unit_id] = (group_pk, rollout_id, turn_index)
        moved = repo.release_waiting(s, targets, stamp)
        to_dispatch = [
            UnitRef("snippet", u, units_of[u][0], units_of[u][1]) for u in sorted(moved) if targets[u] == "queued"
        ]
        skipped = [units_of[u] for u in sorted(moved) if targets[u] == "done"]
        add_skipped(s, skipped)
        return to_dispatch, Counter(group_pk for group_pk, _, _ in skipped)


def add_skipped(s: Session, skipped: Sequence[tuple[int, str, int]]) -> None:
    """Record (group, rollout, search turn) snippet calls skipped as saturated (docs/method.md, "Search credit")."""
    if not skipped:
        return
    stamp = utcnow()
    store_judgments(
        s,
        [
            JudgmentRow(
                {
                    "group_pk": group_pk,
                    "kind": "snippet",
                    "rollout_id": rollout_id,
                    "turn_index": turn_index,
                    "rubric_id": "",
                    "status": "skipped",
                    "cache_hit": False,
                    "attempt_count": 0,
                    "attempts": [],
                    "created_at": stamp,
                }
            )
            for group_pk, rollout_id, turn_index in skipped
        ],
    )
    metrics.SNIPPET_SKIPS.inc(len(skipped))
