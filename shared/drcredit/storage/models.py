"""Database tables. SQLite (embedded) and Postgres (deployment) share one schema.

Judgments are unique per (group, kind, rollout, turn, rubric) so that a redelivered task
can never store a second answer for the same question; every attempt of a judgment is
kept in its row, and a rubric's support history is read from its visit judgments
(drcredit.storage.histories). Credits and advantages live on the turn rows they describe.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from drcredit.storage.types import UTCDateTime


def utcnow() -> datetime:
    return datetime.now(UTC)


NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        list[Any]: JSON,
        datetime: UTCDateTime(),
    }


class Batch(Base):
    __tablename__ = "batches"
    __table_args__ = (UniqueConstraint("tenant", "batch_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    batch_id: Mapped[str] = mapped_column(String(128))
    content_hash: Mapped[str] = mapped_column(String(64))
    #: The batch's groups in posted order (a group re-posted from an earlier batch keeps
    #: its first batch as ``Group.batch_pk`` but is listed here too).
    group_ids: Mapped[list[Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    groups: Mapped[list[Group]] = relationship(back_populates="batch", order_by="Group.batch_position")


class Group(Base):
    __tablename__ = "groups"
    __table_args__ = (
        UniqueConstraint("tenant", "group_id"),
        Index("ix_groups_status", "status"),
        Index("ix_groups_batch", "batch_pk"),
        Index("ix_groups_tenant_run_step", "tenant", "run", "step"),
        Index("ix_groups_held_until", "held_until"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    group_id: Mapped[str] = mapped_column(String(128))
    batch_pk: Mapped[int | None] = mapped_column(ForeignKey("batches.id", ondelete="SET NULL"))
    batch_position: Mapped[int | None] = mapped_column(Integer)
    content_hash: Mapped[str] = mapped_column(String(64))
    question: Mapped[str] = mapped_column(Text)
    rubrics: Mapped[list[Any]] = mapped_column(JSON)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    metadata_: Mapped[Any] = mapped_column("metadata", JSON, nullable=True)
    #: ``metadata.run`` and ``metadata.step``: the training run and step the group belongs to.
    run: Mapped[str | None] = mapped_column(String(128))
    step: Mapped[int | None] = mapped_column(BigInteger)
    expected_rollouts: Mapped[int] = mapped_column(Integer)
    rollouts_received: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    error: Mapped[str | None] = mapped_column(Text)
    judge_backend: Mapped[str] = mapped_column(String(32))
    judge_model: Mapped[str] = mapped_column(String(256))
    #: Judge calls the group may need: judged visits x positive rubrics + snippet tasks.
    judgments_planned: Mapped[int] = mapped_column(Integer, default=0)
    units_total: Mapped[int] = mapped_column(Integer, default=0)
    units_done: Mapped[int] = mapped_column(Integer, default=0)
    #: pending -> enqueued -> done; the conditional flip to enqueued makes the last
    #: finishing unit the only one that schedules aggregation.
    aggregation: Mapped[str] = mapped_column(String(16), default="pending")
    stats: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    #: The advantages document as served (docs/api.md, JSON text), written with the results:
    #: a done group's document never changes, and a long-poll answers from this one
    #: column instead of the group's turns and judgment counts. Loaded only when asked.
    advantages_json: Mapped[str | None] = mapped_column(Text, deferred=True)
    #: Set while a judgment of the group waits for an unreachable judge (docs/method.md, "Judge failures"):
    #: since when, and the judge's last error.
    judge_waiting_since: Mapped[datetime | None] = mapped_column()
    judge_waiting_reason: Mapped[str | None] = mapped_column(Text)
    #: Accepted past a budget of its tenant (``on_budget: wait``): its work is not sent
    #: before this (the budget's reset), which budget held it (docs/api.md).
    held_until: Mapped[datetime | None] = mapped_column()
    held_for: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    batch: Mapped[Batch | None] = relationship(back_populates="groups")
    rollouts: Mapped[list[Rollout]] = relationship(
        back_populates="group", order_by="Rollout.position", cascade="all, delete-orphan"
    )


class Rollout(Base):
    __tablename__ = "rollouts"
    __table_args__ = (UniqueConstraint("group_pk", "rollout_id"), UniqueConstraint("group_pk", "position"))

    id: Mapped[int] = mapped_column(primary_key=True)
    group_pk: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    rollout_id: Mapped[str] = mapped_column(String(256))
    content_hash: Mapped[str] = mapped_column(String(64))
    outcome_reward: Mapped[float | None] = mapped_column(Float)
    outcome_advantage: Mapped[float | None] = mapped_column(Float)
    #: Request signatures of its judge calls (see drcredit.domain.dedupe), so that a
    #: rollout streamed in later can tell which of its requests may have a twin.
    signatures: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    #: The turns with their text taken out (drcredit.domain.outline): all that
    #: aggregation and replay read of the rollout. None for rows stored before 0002.
    outline: Mapped[list[Any] | None] = mapped_column(JSON)
    #: With ``outcome_source: judge``: what the outcome reward reads of the rollout
    #: (drcredit.domain.outcome.ReportFacts), stored at ingest, and once aggregated the
    #: reward's breakdown (components, rubric scores, claims).
    outcome_facts: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    outcome: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    arrived_at: Mapped[datetime] = mapped_column(default=utcnow)

    group: Mapped[Group] = relationship(back_populates="rollouts")
    turns: Mapped[list[Turn]] = relationship(
        back_populates="rollout", order_by="Turn.index", cascade="all, delete-orphan"
    )


class Turn(Base):
    """One input turn, its body as posted, and (once aggregated) its credit and advantage."""

    __tablename__ = "turns"
    __table_args__ = (UniqueConstraint("rollout_pk", "index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    rollout_pk: Mapped[int] = mapped_column(ForeignKey("rollouts.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(16))
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    credit: Mapped[float | None] = mapped_column(Float)
    visit_credit: Mapped[float | None] = mapped_column(Float)
    visit_credit_uncapped: Mapped[float | None] = mapped_column(Float)
    navigation_credit: Mapped[float | None] = mapped_column(Float)
    snippet_credit: Mapped[float | None] = mapped_column(Float)
    snippet_matches: Mapped[int | None] = mapped_column(Integer)
    #: A_rg, the normalized credit (docs/method.md, "Advantages").
    process_advantage: Mapped[float | None] = mapped_column(Float)
    #: D, the discounted process advantage (equal to A_rg when gamma = 0).
    discounted_process_advantage: Mapped[float | None] = mapped_column(Float)
    advantage: Mapped[float | None] = mapped_column(Float)
    #: The credit depends on a failed judgment (docs/method.md, "Judge failures").
    unscorable: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))

    rollout: Mapped[Rollout] = relationship(back_populates="turns")


class Judgment(Base):
    """One ordinal judgment: a (visit, rubric) level or a search turn's snippet matches."""

    __tablename__ = "judgments"
    __table_args__ = (
        UniqueConstraint("group_pk", "kind", "rollout_id", "turn_index", "rubric_id"),
        # Only requests that can have an identical twin carry a key (see drcredit.domain.dedupe).
        Index(
            "ix_judgments_request_key",
            "group_pk",
            "request_key",
            postgresql_where=text("request_key IS NOT NULL"),
            sqlite_where=text("request_key IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    group_pk: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"))
    #: visit | snippet | rubric | citation (the last two: outcome judgments, docs/method.md,
    #: "Outcome reward", on the answer turn; ``rubric_id`` holds the rubric id, or ``claim:call`` for a
    #: citation call, and ``level`` the score)
    kind: Mapped[str] = mapped_column(String(16))
    rollout_id: Mapped[str] = mapped_column(String(256))
    turn_index: Mapped[int] = mapped_column(Integer)
    rubric_id: Mapped[str] = mapped_column(String(256), default="")  # "" for snippet judgments
    #: ok | failed | deterministic (no usable page, no call) | skipped (saturated search)
    status: Mapped[str] = mapped_column(String(16))
    level: Mapped[int | None] = mapped_column(Integer)
    page_ids: Mapped[list[Any] | None] = mapped_column(JSON)
    support_points: Mapped[list[Any] | None] = mapped_column(JSON)
    matches: Mapped[list[Any] | None] = mapped_column(JSON)
    rejected_matches: Mapped[list[Any] | None] = mapped_column(JSON)
    match_count: Mapped[int | None] = mapped_column(Integer)
    rationale: Mapped[str | None] = mapped_column(Text)
    answer: Mapped[Any] = mapped_column(JSON, nullable=True)
    prior_support: Mapped[int | None] = mapped_column(Integer)
    request_key: Mapped[str | None] = mapped_column(String(64))
    #: Answered without a call: an identical request's answer (its group's twin, or with
    #: ``reused`` one kept in the tenant's store of earlier answers, ``judge_answers``).
    cache_hit: Mapped[bool] = mapped_column(Boolean, default=False)
    reused: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    #: The layout the prompt was rendered in (drcredit.judges.prompts.LAYOUTS; null before 0010).
    prompt_layout: Mapped[str | None] = mapped_column(String(32))
    backend: Mapped[str | None] = mapped_column(String(32))
    #: The model the platform asked for (its setting); ``served_model``: the one the
    #: server said answered, and ``endpoint`` the endpoint it answered from (of a reused
    #: answer: the call that gave it; of a failed judgment: its last attempt).
    model: Mapped[str | None] = mapped_column(String(256))
    served_model: Mapped[str | None] = mapped_column(String(256))
    endpoint: Mapped[str | None] = mapped_column(String(512))
    latency_s: Mapped[float | None] = mapped_column(Float)
    #: Tokens of every attempt (0 for a reused answer: it made no call). The cached part
    #: of the prompt tokens (the server's prefix cache), and the part the platform
    #: estimated for calls cut off before any usage came back.
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cached_prompt_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    estimated_prompt_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    attempt_count: Mapped[int] = mapped_column(Integer, default=0)
    #: Every attempt of the judge call, in order (drcredit.judges.attempts.Attempt: number,
    #: outcome, error, latency_s, tokens, endpoint, model, ...; empty when no call was made).
    attempts: Mapped[list[Any] | None] = mapped_column(JSON)
    failure_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WorkUnit(Base):
    """A schedulable piece of a group's judging: a visit chain, a snippet call, aggregation.

    Status: waiting (a snippet call whose navigation credit is not known yet), queued,
    running, done, cancelled (its group failed). ``attempts`` counts deliveries so a poisoned unit stops being retried.
    """

    __tablename__ = "work_units"
    __table_args__ = (
        UniqueConstraint("group_pk", "kind", "unit_key"),
        Index("ix_work_units_group_status", "group_pk", "status"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    group_pk: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))  # visit_chain | snippet | outcome
    unit_key: Mapped[str] = mapped_column(String(600))
    rollout_id: Mapped[str] = mapped_column(String(256))
    rubric_id: Mapped[str | None] = mapped_column(String(256))
    turn_index: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    #: Turns whose judge request may have an identical twin elsewhere in the group; only
    #: these are looked up and claimed before the call.
    dedupe_turns: Mapped[list[Any] | None] = mapped_column(JSON)
    #: A snippet call's eligible results (id, url, title, snippet), so that the snippet
    #: matcher never loads the rollout. None for visit chains and rows stored before 0002.
    payload: Mapped[list[Any] | None] = mapped_column(JSON)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text)
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column()
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class RequestClaim(Base):
    """A judge request being answered by one process; others wait for its stored answer."""

    __tablename__ = "request_claims"
    __table_args__ = (UniqueConstraint("group_pk", "request_key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    group_pk: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"))
    request_key: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str] = mapped_column(String(128))
    claimed_at: Mapped[datetime] = mapped_column()


class JudgeAnswer(Base):
    """A valid judge answer kept so that the tenant's identical requests are answered
    from it instead of the judge (drcredit.scoring.work.reuse). ``digest`` is the request's
    (drcredit.judges.requests.Prompt.digest: model, messages, format, sampling)."""

    __tablename__ = "judge_answers"
    __table_args__ = (
        UniqueConstraint("tenant", "digest"),
        Index("ix_judge_answers_created_at", "created_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    digest: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(256))
    backend: Mapped[str] = mapped_column(String(32))
    #: Who gave the answer (as on a judgment).
    served_model: Mapped[str | None] = mapped_column(String(256))
    endpoint: Mapped[str | None] = mapped_column(String(512))
    #: The judge's JSON answer and the validated verdict (its fields by kind).
    answer: Mapped[Any] = mapped_column(JSON, nullable=True)
    verdict: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class JudgeEndpoint(Base):
    """The state of one judge endpoint as the processes calling it last saw it.

    Written on each change of a process's circuit breaker (drcredit.judges.breaker), so
    that ``/readyz`` and the status documents can say the judge is down, and since when,
    whichever process noticed it.
    """

    __tablename__ = "judge_endpoints"

    endpoint: Mapped[str] = mapped_column(String(512), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))  # up | down
    since: Mapped[datetime] = mapped_column()
    reason: Mapped[str | None] = mapped_column(Text)
    outages: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Replay(Base):
    """A sensitivity replay under other parameters, kept for later comparison."""

    __tablename__ = "replays"

    id: Mapped[int] = mapped_column(primary_key=True)
    group_pk: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"))
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    result: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Audit(Base):
    """A judge audit: sampled done groups re-scored by a second judge and compared.

    The re-scoring is kept apart (:class:`AuditGroup`): an audit never changes a group,
    its judgments or its stored documents.
    """

    __tablename__ = "audits"
    __table_args__ = (
        UniqueConstraint("audit_id"),
        Index("ix_audits_tenant_created", "tenant", "created_at"),
        Index("ix_audits_held_until", "held_until"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    audit_id: Mapped[str] = mapped_column(String(64))
    tenant: Mapped[str] = mapped_column(String(128))
    #: The audit judge's name in DRCREDIT_AUDIT_JUDGES, and its model.
    judge: Mapped[str] = mapped_column(String(128))
    judge_model: Mapped[str | None] = mapped_column(String(256))
    #: What was asked: ``{"run": R}``, ``{"batch_id": B}`` or ``{"group_ids": [...]}``.
    scope: Mapped[dict[str, Any]] = mapped_column(JSON)
    sample_groups: Mapped[int | None] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(BigInteger, default=0)
    #: queued | running | done | failed (queued with ``held_until``: shown ``waiting_for_budget``)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    error: Mapped[str | None] = mapped_column(Text)
    #: The sampled groups (public ids), in order.
    group_ids: Mapped[list[Any]] = mapped_column(JSON)
    #: The report (agreement, effect, usage) once done.
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    #: The process running it and until when that claim holds (renewed while it runs).
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[datetime | None] = mapped_column()
    #: Accepted past its tenant's budget (``on_budget: wait``): queued, and neither sent
    #: nor claimed before this reset; the budget it waits for.
    held_until: Mapped[datetime | None] = mapped_column()
    held_for: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()


class AuditGroup(Base):
    """One sampled group as the audit judge scored it: its judgments and advantages."""

    __tablename__ = "audit_groups"
    __table_args__ = (UniqueConstraint("audit_pk", "group_pk"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    audit_pk: Mapped[int] = mapped_column(ForeignKey("audits.id", ondelete="CASCADE"))
    group_pk: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"))
    #: Every judgment the audit judge made: kind, key, status, value, history size, attempts.
    judgments: Mapped[list[Any]] = mapped_column(JSON)
    #: Per rollout and turn: process advantage (A_rg) and fused advantage; outcome rewards.
    advantages: Mapped[dict[str, Any]] = mapped_column(JSON)
    usage: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Label(Base):
    """A person's value for one judgment's key (docs/audit.md, "Labels from people").

    Keys are those the audit compares: ``kind`` visit | snippet (``turn_index`` and the
    rubric in ``key_id``), report_rubric (the rubric) or citation (the claim index);
    the two outcome kinds have no turn (``turn_index`` -1). One value per labeler and
    key: a second label replaces the first.
    """

    __tablename__ = "labels"
    __table_args__ = (
        UniqueConstraint(
            "tenant", "group_pk", "kind", "rollout_id", "turn_index", "key_id", "labeler", name="uq_labels_item_labeler"
        ),
        Index("ix_labels_tenant_labeler", "tenant", "labeler"),
        Index("ix_labels_group_pk", "group_pk"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    group_pk: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    rollout_id: Mapped[str] = mapped_column(String(256))
    turn_index: Mapped[int] = mapped_column(Integer)
    key_id: Mapped[str] = mapped_column(String(256))
    labeler: Mapped[str] = mapped_column(String(128))
    value: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class TenantUsage(Base):
    """The judge usage of a tenant's finished groups and ended judge audits, per bucket
    of time (an hour, or a test window): written in the transaction that ends each
    group or audit, so a group counts here once it is final and in the sums over its
    judgments while it runs."""

    __tablename__ = "tenant_usage"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    bucket: Mapped[datetime] = mapped_column(primary_key=True)
    calls: Mapped[int] = mapped_column(BigInteger, default=0)
    judgments: Mapped[int] = mapped_column(BigInteger, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    estimated_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    reused: Mapped[int] = mapped_column(BigInteger, default=0)
