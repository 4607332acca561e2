"""The scoring tables: batches, groups, their rollouts and turns, the judgments, the
work units that make them, and the claims by which one process asks a group's judge
request while the others wait for its answer."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from drcredit.storage.models.base import Base, utcnow


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
