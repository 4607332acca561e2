"""What a process keeps of stored groups for the units that come back to it.

A rollout, its plan and its group's parameters never change once stored, so a worker
reads and validates each once. The caches are read from the engine loop and from its
database threads (:class:`~drcredit.recent.Recent` is thread-safe); concurrent
loads of one rollout on the engine loop share one read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any

import orjson
from sqlalchemy.orm import Session

from drcredit.domain.credit import RolloutPlan, plan_rollout
from drcredit.domain.group import GroupContent, Rollout, Rubric
from drcredit.domain.params import ScoringParams
from drcredit.metrics import ROLLOUT_CACHE_BYTES
from drcredit.recent import Recent
from drcredit.scoring.engine import Engine
from drcredit.scoring.errors import NotFound
from drcredit.scoring.intake.content import parse_rubrics
from drcredit.storage import repository as repo
from drcredit.storage.database import Database

#: Rollout content kept per process by default, in bytes of its stored JSON (in memory
#: it takes about 1.4 times that): four default benchmark steps of 27 MB each.
DEFAULT_CONTENT_BUDGET = 128 << 20


class RolloutCache:
    """Rollout content, plans, group parameters and group headers, per process."""

    def __init__(self, db: Database, engine: Engine, content_budget: int = DEFAULT_CONTENT_BUDGET):
        self.db = db
        self.engine = engine
        #: Content per (group, rollout): a message carries one rollout's units, which
        #: share it. Bounded by its stored size: with only a count bound (4,096
        #: rollouts), a worker grew by about 30 MB with each default benchmark step
        #: (781 MB after ten), toward the 1 GiB limit of the Kubernetes manifests.
        self._content: Recent[tuple[int, str], GroupContent] = Recent(budget=content_budget)
        #: Content loads in flight on the engine loop: a message's units start together
        #: and would otherwise each load (and validate) the same rollout.
        self._loads: dict[tuple[int, str], asyncio.Future[GroupContent]] = {}
        self._plans: Recent[tuple[int, str], RolloutPlan] = Recent()
        #: Question and positive rubrics per group, for snippet calls (which carry their
        #: results and need nothing else of the group). Filled by claims.
        self._headers: Recent[int, tuple[str, tuple[Rubric, ...]]] = Recent()
        self._params: Recent[int, ScoringParams] = Recent()

    def params(self, group_pk: int, stored: dict[str, Any]) -> ScoringParams:
        """A group's parameters, validated once per process (they never change)."""
        params = self._params.get(group_pk)
        if params is None:
            params = ScoringParams.model_validate(stored)
            self._params.put(group_pk, params)
        return params

    def header(self, group_pk: int) -> tuple[str, tuple[Rubric, ...]] | None:
        return self._headers.get(group_pk)

    def remember_header(self, group_pk: int, question: str, rubrics: Any) -> None:
        positive = tuple(r for r in parse_rubrics(rubrics) if r.positive)
        self._headers.put(group_pk, (question, positive))

    def content(self, group_pk: int, rollout_id: str, session: Session | None = None) -> GroupContent:
        """The group's question and rubrics with one rollout: all that rollout's units read.

        ``session``: read in the caller's transaction (a writer holding SQLite's write
        lock must not wait on a second connection of its own).
        """
        key = (group_pk, rollout_id)
        cached = self._content.get(key)
        if cached is not None:
            return cached
        with nullcontext(session) if session is not None else self.db.session() as s:
            document = repo.rollout_document(s, group_pk, rollout_id)
        if document is None:
            raise NotFound(f"rollout {rollout_id!r} of group {group_pk} not found")
        content = GroupContent.model_validate(document)
        self._keep(key, content, document)
        return content

    def preload(self, wanted: Iterable[tuple[int, str]]) -> None:
        """Read the content of several rollouts not cached yet, one query per group.

        A delivery's units are claimed together; reading their rollouts with the claim
        spares each rollout its own turn on the database threads, where, in a step's
        first wave, a load waited a median 0.7 s behind the others (BENCHMARKS.md).
        """
        missing: dict[int, set[str]] = {}
        for group_pk, rollout_id in wanted:
            if self._content.get((group_pk, rollout_id)) is None:
                missing.setdefault(group_pk, set()).add(rollout_id)
        if not missing:
            return
        with self.db.read_session() as s:
            for group_pk, rollout_ids in missing.items():
                for rollout_id, document in repo.rollout_documents(s, group_pk, rollout_ids).items():
                    self._keep((group_pk, rollout_id), GroupContent.model_validate(document), document)

    def _keep(self, key: tuple[int, str], content: GroupContent, document: Any) -> None:
        # Weighed by the document's size as stored (about 60 us for 150 KB, once per read).
        self._content.put(key, content, len(orjson.dumps(document)))
        ROLLOUT_CACHE_BYTES.set(self._content.weight)

    async def acontent(self, group_pk: int, rollout_id: str) -> GroupContent:
        """:meth:`content` from the engine loop, read on a database thread."""
        key = (group_pk, rollout_id)
        cached = self._content.get(key)
        if cached is not None:
            return cached
        loading = self._loads.get(key)
        if loading is None:
            loading = asyncio.ensure_future(self.engine.db(self.content, group_pk, rollout_id))
            self._loads[key] = loading
            loading.add_done_callback(lambda _: self._loads.pop(key, None))
        # Shielded: one waiter's cancellation must not cancel the others' load.
        return await asyncio.shield(loading)

    def plan(self, group_pk: int, content: GroupContent, rollout: Rollout, params: ScoringParams) -> RolloutPlan:
        """A rollout's plan, computed once per process for all its units."""
        key = (group_pk, rollout.id)
        plan = self._plans.get(key)
        if plan is None:
            plan = plan_rollout(content, rollout, params)
            self._plans.put(key, plan)
        return plan

    @property
    def content_bytes(self) -> int:
        """The stored JSON size of the rollout content kept now."""
        return self._content.weight

    @property
    def content_budget(self) -> int | None:
        """The most rollout content kept, in bytes of stored JSON (``DRCREDIT_ROLLOUT_CACHE_MB``)."""
        return self._content.budget

    @content_budget.setter
    def content_budget(self, budget: int | None) -> None:
        self._content.budget = budget
