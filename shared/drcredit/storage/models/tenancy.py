"""The tenants' ledger of judge usage, by hour (budgets and quotas read it)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from drcredit.storage.models.base import Base


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
