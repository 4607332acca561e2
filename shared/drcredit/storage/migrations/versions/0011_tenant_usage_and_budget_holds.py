"""tenant usage and budget holds: each tenant's judge usage per hour, held groups

``tenant_usage`` keeps the usage of each tenant's finished groups per bucket of time
(written in the transaction that ends a group), so a budget check sums a few rows
instead of a month of judgments. ``groups.held_until`` / ``held_for``: a group accepted
past a budget with ``on_budget: wait`` is not sent before the budget's reset.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 11:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenant_usage",
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("bucket", sa.DateTime(timezone=True), nullable=False),
        sa.Column("calls", sa.BigInteger(), nullable=False),
        sa.Column("judgments", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("estimated_prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("reused", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "bucket", name=op.f("pk_tenant_usage")),
    )
    with op.batch_alter_table("groups") as batch:
        batch.add_column(sa.Column("held_until", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("held_for", sa.String(length=32), nullable=True))
    op.create_index("ix_groups_held_until", "groups", ["held_until"])


def downgrade() -> None:
    op.drop_index("ix_groups_held_until", table_name="groups")
    with op.batch_alter_table("groups") as batch:
        batch.drop_column("held_for")
        batch.drop_column("held_until")
    op.drop_table("tenant_usage")
