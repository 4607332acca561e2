"""The audit's tables: sensitivity replays, judge audits and their groups, and people's
labels."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from drcredit.storage.models.base import Base, utcnow


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
