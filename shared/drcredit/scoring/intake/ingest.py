"""Groups, batches and streamed rollouts coming in: checked, stored once, started.

Every check (size limits, validation, a ``group_id`` or ``batch_id`` taken by other
content) runs before anything is written, and each group is stored in one transaction
(:mod:`drcredit.scoring.intake.planning` writes its rows), so an input is either whole or
absent. Posting the same content again answers with what is stored (idempotency on
``group_id``, ``batch_id`` and rollout ``id``); a group's units are dispatched after its
commit, so a worker never claims a unit it cannot see.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from drcredit import metrics
from drcredit.domain.batch import BatchIn
from drcredit.domain.credit import plan_rollout
from drcredit.domain.dedupe import signatures, twin_turns
from drcredit.domain.errors import FieldError, InvalidInput
from drcredit.domain.group import (
    GroupContent,
    GroupIn,
    Rollout,
    is_valid_group_id,
    judged_reward_given,
    run_and_step,
)
from drcredit.domain.limits import Limits, group_limit_problems, rollout_limit_problems
from drcredit.judges.base import Judge
from drcredit.scoring.dispatch import Dispatcher
from drcredit.scoring.errors import Conflict, NotFound
from drcredit.scoring.intake.content import (
    Dumped,
    canonical_hash,
    group_differences,
    group_hash,
    params_of,
    request_digest,
)
from drcredit.scoring.intake.planning import RolloutToStore, longest_chain, store_rollouts
from drcredit.scoring.work.lifecycle import aggregate_ready, dispatch_queued
from drcredit.storage import models as m
from drcredit.storage import repository as repo
from drcredit.storage.database import Database

#: Groups of a batch stored at once (each in its own transaction).
INGEST_THREADS = 3


@dataclass(frozen=True)
class Submitted:
    group_pk: int
    group_id: str
    status: str
    created: bool
    #: Held for its tenant's budget: its work is sent when the budget resets.
    held: bool = False

    @property
    def shown_status(self) -> str:
        """The status a client is told: a held group still queued is ``waiting_for_budget``,
        as ``GET /v1/groups/{id}`` says."""
        return "waiting_for_budget" if self.held and self.status == "queued" else self.status


@dataclass(frozen=True)
class Hold:
    """New groups are stored but not sent before ``until`` (a budget's reset)."""

    until: datetime
    budget: str


class Ingest:
    """Stores what trainers post and starts its units."""

    def __init__(
        self,
        db: Database,
        judge: Judge,
        dispatcher: Dispatcher,
        *,
        limits: Limits,
        default_failure_policy: str,
    ):
        self.db = db
        self.judge = judge
        self.dispatcher = dispatcher
        self.limits = limits
        self.default_failure_policy = default_failure_policy

    def submit_group(
        self,
        tenant: str,
        group: GroupIn,
        *,
        position: int | None = None,
        prepared: tuple[Dumped, str] | None = None,
        hold: Hold | None = None,
    ) -> Submitted:
        """Store a group in its own transaction and start judging it; idempotent on ``group_id``.

        ``position`` and ``prepared`` come from :meth:`submit_batch` (see :meth:`_store_group`);
        ``hold``: a new group waits for its tenant's budget to reset.
        """
        if prepared is None:  # a batch's groups were checked together
            self.check_limits([group])
        try:
            with self.db.session() as s:
                submitted = self._store_group(s, tenant, group, position, prepared, hold)
        except IntegrityError:
            # A concurrent post of the same group_id won the insert: answer as a re-post.
            with self.db.session() as s:
                submitted = self._store_group(s, tenant, group, position, prepared, hold)
        self.start([submitted])
        return submitted

    def start(self, submitted: Sequence[Submitted]) -> None:
        """Dispatch the queued units of newly stored groups (after their commit), in order."""
        metrics.GROUPS_INGESTED.inc(sum(1 for sub in submitted if sub.created))
        created = [sub.group_pk for sub in submitted if sub.created and not sub.held]
        if not created:
            return
        dispatch_queued(self.db, self.dispatcher, created)
        # A group with nothing to judge (every call a deterministic zero or skipped) goes
        # straight to aggregation.
        aggregate_ready(self.db, self.dispatcher, created)

    def check_limits(self, groups: Sequence[GroupIn], *, batch: bool = False) -> None:
        """Refuse groups over the service's size limits (a 422 naming each field)."""
        problems = []
        for i, group in enumerate(groups):
            for p in group_limit_problems(group, self.limits, group.expected_rollouts):
                problems.append(FieldError(f"groups[{i}].{p.field}", p.message) if batch else p)
        if problems:
            raise InvalidInput(problems)

    def resolve(self, group: GroupIn) -> GroupIn:
        """Fill the failure policy from settings when the group leaves it unset."""
        if "on_judge_failure" in group.params.model_fields_set:
            return group
        params = group.params.model_copy(update={"on_judge_failure": self.default_failure_policy})
        return group.model_copy(update={"params": params})

    def submit_batch(self, tenant: str, batch: BatchIn, hold: Hold | None = None) -> tuple[str, list[Submitted], bool]:
        """Store a batch's groups and start each as soon as it is stored; idempotent on batch_id.

        Every input check (validation, a group_id taken by other content) runs before
        anything is written. Each group is then stored in its own transaction and its
        judging starts at once, so a step's judging overlaps its ingest; the batch row,
        written last, makes the batch visible. Re-posting after an interruption stores
        what is missing: the groups already stored are recognised by their group_id.
        """
        self.check_limits(batch.groups, batch=True)
        groups = [self.resolve(g) for g in batch.groups]
        batch_id = batch.batch_id or uuid.uuid4().hex
        # A group's JSON and hash are made when it is stored (in its ingest thread), so
        # the first group starts judging without waiting for the others to be dumped;
        # only a group_id already taken, or a re-posted batch, needs them up front.
        prepared: list[tuple[Dumped, str] | None] = [None] * len(groups)

        def prepare(i: int) -> tuple[Dumped, str]:
            made = prepared[i]
            if made is None:
                dumped = Dumped.of(groups[i])
                made = prepared[i] = (dumped, group_hash(groups[i], dumped))
            return made

        def digest() -> str:
            return canonical_hash([prepare(i)[1] for i in range(len(groups))] + [g.group_id for g in groups])

        with self.db.session() as s:
            existing = self._existing_batch(s, tenant, batch_id, digest)
            if existing is not None:
                return batch_id, existing, False
            named = {g.group_id: i for i, g in enumerate(groups) if g.group_id is not None}
            for group_id, stored_hash in s.execute(
                select(m.Group.group_id, m.Group.content_hash).where(
                    m.Group.tenant == tenant, m.Group.group_id.in_(list(named))
                )
            ):
                i = named[group_id]
                if stored_hash != prepare(i)[1]:
                    taken = s.scalars(
                        select(m.Group).where(m.Group.tenant == tenant, m.Group.group_id == group_id)
                    ).one()
                    differences = group_differences(s, taken, groups[i], prepare(i)[0])
                    raise Conflict(
                        f"groups[{i}]: group_id {group_id!r} already exists with different content",
                        [(f"groups[{i}].{field}", what) for field, what in differences],
                    )
        # Groups with the longest visit chains are stored (and start judging) first: the
        # step ends when its longest chain does, so that chain should not wait for the
        # ingest of the others.
        order = sorted(range(len(groups)), key=lambda i: -longest_chain(groups[i]))
        by_position: dict[int, Submitted] = {}
        # On Postgres a few groups are stored at once: while one transaction waits on the
        # server (its COPY of turn bodies, its commit), another builds its rows. SQLite
        # has one writer at a time.
        threads = INGEST_THREADS if self.db.engine.dialect.name == "postgresql" else 1
        with ThreadPoolExecutor(threads, thread_name_prefix="drcredit-ingest") as pool:
            stored = pool.map(
                lambda i: self.submit_group(tenant, groups[i], position=i, prepared=prepare(i), hold=hold), order
            )
            by_position.update(zip(order, stored, strict=True))
        submitted = [by_position[i] for i in range(len(groups))]
        try:
            with self.db.session() as s:
                row = m.Batch(
                    tenant=tenant, batch_id=batch_id, content_hash=digest(), group_ids=[x.group_id for x in submitted]
                )
                s.add(row)
                s.flush()
                created = {x.group_pk for x in submitted if x.created}
                # Judging has started: lock the group rows in id order, as the workers do.
                repo.lock_groups(s, created)
                s.execute(update(m.Group).where(m.Group.id.in_(sorted(created))).values(batch_pk=row.id))
        except IntegrityError:
            # A concurrent post of the same batch_id wrote the batch row first.
            with self.db.session() as s:
                existing = self._existing_batch(s, tenant, batch_id, digest)
            assert existing is not None
            return batch_id, existing, False
        return batch_id, submitted, True

    @staticmethod
    def _existing_batch(s: Session, tenant: str, batch_id: str, digest: Callable[[], str]) -> list[Submitted] | None:
        """The groups of an already stored batch (``digest``, its content's hash, is only
        made when there is one to compare with)."""
        existing = s.scalar(select(m.Batch).where(m.Batch.tenant == tenant, m.Batch.batch_id == batch_id))
        if existing is None:
            return None
        if existing.content_hash != digest():
            message = f"batch_id {batch_id!r} already exists with different content"
            raise Conflict(message, [("batch_id", message)])
        rows = s.execute(
            select(m.Group.id, m.Group.group_id, m.Group.status, m.Group.held_until).where(
                m.Group.tenant == tenant, m.Group.group_id.in_(existing.group_ids)
            )
        ).all()
        by_id = {gid: Submitted(pk, gid, st, False, held=until is not None) for pk, gid, st, until in rows}
        return [by_id[g] for g in existing.group_ids]

    def _store_group(
        self,
        s: Session,
        tenant: str,
        group: GroupIn,
        position: int | None,
        prepared: tuple[Dumped, str] | None = None,
        hold: Hold | None = None,
    ) -> Submitted:
        """Store a group; ``prepared``: its rollouts' JSON and its hash, when already made."""
        group = self.resolve(group)
        dumped, digest = prepared or (None, None)
        if dumped is None or digest is None:
            dumped = Dumped.of(group)
            digest = group_hash(group, dumped)
        if group.group_id is not None:
            existing = s.scalar(select(m.Group).where(m.Group.tenant == tenant, m.Group.group_id == group.group_id))
            if existing is not None:
                if existing.content_hash != digest:
                    raise Conflict(
                        f"group_id {group.group_id!r} already exists with different content",
                        group_differences(s, existing, group, dumped),
                    )
                return Submitted(
                    existing.id, existing.group_id, existing.status, False, held=existing.held_until is not None
                )
        group_id = group.group_id or uuid.uuid4().hex
        run, step = run_and_step(group.metadata)
        row = m.Group(
            tenant=tenant,
            group_id=group_id,
            batch_position=position,  # batch_pk is set with the batch row, written last
            content_hash=digest,
            question=group.question,
            rubrics=[r.model_dump(mode="json") for r in group.rubrics],
            params=group.params.model_dump(mode="json"),
            metadata_=group.metadata,
            run=run,
            step=step,
            expected_rollouts=group.expected_rollouts or len(group.rollouts),
            rollouts_received=0,
            status="queued",
            judge_backend=self.judge.backend,
            judge_model=self.judge.model,
            units_total=0,
            units_done=0,
            judgments_planned=0,
            aggregation="pending",
            held_until=hold.until if hold else None,
            held_for=hold.budget if hold else None,
        )
        s.add(row)
        s.flush()
        params = params_of(row)
        plans = {r.id: plan_rollout(group, r, params) for r in group.rollouts}
        sigs = {r.id: signatures(r, plans[r.id], request_digest) for r in group.rollouts}
        twins = twin_turns(sigs)
        store_rollouts(
            s,
            row,
            group,
            dumped,
            [
                RolloutToStore(position_, rollout, plans[rollout.id], sigs[rollout.id], twins[rollout.id])
                for position_, rollout in enumerate(group.rollouts)
            ],
        )
        s.flush()
        return Submitted(row.id, group_id, row.status, True, held=hold is not None)

    def add_rollout(self, tenant: str, group_id: str, rollout: Rollout) -> tuple[Submitted, bool]:
        """Add one rollout to an open streaming group; idempotent on the rollout id."""
        if not is_valid_group_id(group_id):
            raise NotFound(f"group {group_id!r} not found")
        problems = rollout_limit_problems(rollout, self.limits)
        if problems:
            raise InvalidInput(problems)
        with self.db.session() as s:
            row = s.scalar(
                select(m.Group).where(m.Group.tenant == tenant, m.Group.group_id == group_id).with_for_update()
            )
            if row is None:
                raise NotFound(f"group {group_id!r} not found")
            existing = s.scalar(
                select(m.Rollout).where(m.Rollout.group_pk == row.id, m.Rollout.rollout_id == rollout.id)
            )
            dumped = Dumped({rollout.id: rollout.model_dump(mode="json")})
            if existing is not None:
                if existing.content_hash != dumped.rollout_hash(rollout.id):
                    message = f"rollout {rollout.id!r} already exists in group {group_id!r} with different content"
                    raise Conflict(message, [("id", message)])
                return Submitted(row.id, row.group_id, row.status, False), False
            if row.rollouts_received >= row.expected_rollouts:
                message = f"group {group_id!r} already has all {row.expected_rollouts} rollouts (its expected_rollouts)"
                raise Conflict(message, [("group_id", message)])
            if row.status == "failed":
                message = f"group {group_id!r} has failed: {row.error}"
                raise Conflict(message, [("group_id", message)])
            params = params_of(row)
            if params.outcome_source == "judge" and rollout.outcome_reward is not None:
                raise InvalidInput([judged_reward_given("outcome_reward")])
            rewarded = s.scalars(select(m.Rollout.outcome_reward).where(m.Rollout.group_pk == row.id)).all()
            if rewarded and params.outcome_source == "given":
                has = [r is not None for r in rewarded]
                if all(has) and rollout.outcome_reward is None:
                    raise reward_error("missing; the group's other rollouts have an outcome_reward")
                if not any(has) and rollout.outcome_reward is not None:
                    raise reward_error(
                        "given, but the group's other rollouts have none; give it on every rollout or on none"
                    )
            content = GroupContent.model_validate({"question": row.question, "rubrics": row.rubrics, "rollouts": []})
            plan = plan_rollout(content, rollout, params)
            sigs = signatures(rollout, plan, request_digest)
            seen: set[str] = set()
            for earlier in s.scalars(select(m.Rollout.signatures).where(m.Rollout.group_pk == row.id)):
                seen.update(earlier or {})
            twins = {t for sig, turns in sigs.items() if sig in seen for t in turns}
            store_rollouts(
                s,
                row,
                content,
                dumped,
                [RolloutToStore(row.rollouts_received, rollout, plan, sigs, twins)],
            )
            submitted = Submitted(row.id, row.group_id, row.status, True, held=row.held_until is not None)
        if submitted.held:  # sent with the rest of the group when its budget resets
            return submitted, True
        dispatch_queued(self.db, self.dispatcher, [row.id])
        aggregate_ready(self.db, self.dispatcher, [row.id])
        return submitted, True


def reward_error(message: str) -> InvalidInput:
    return InvalidInput([FieldError("outcome_reward", message)])
