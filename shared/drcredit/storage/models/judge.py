"""What the platform keeps of the judge: the tenants' store of answers (reuse) and each
endpoint's state as the calling processes last saw it (up or down, and since when)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from drcredit.storage.models.base import Base, utcnow


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
