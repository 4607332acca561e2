"""judge audits: sampled groups re-scored by a second judge, kept apart

An audit row says what was asked (judge, scope, sample, seed), which groups were
sampled, its status and its report; one audit_groups row per sampled group holds the
audit judge's judgments and advantages. No existing table changes.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 20:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audits",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("audit_id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("judge", sa.String(length=128), nullable=False),
        sa.Column("judge_model", sa.String(length=256), nullable=True),
        sa.Column("scope", sa.JSON(), nullable=False),
        sa.Column("sample_groups", sa.Integer(), nullable=True),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("group_ids", sa.JSON(), nullable=False),
        sa.Column("report", sa.JSON(), nullable=True),
        sa.Column("lease_owner", sa.String(length=128), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audits")),
        sa.UniqueConstraint("audit_id", name=op.f("uq_audits_audit_id")),
    )
    op.create_index("ix_audits_tenant_created", "audits", ["tenant", "created_at"])
    op.create_table(
        "audit_groups",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("audit_pk", sa.Integer(), nullable=False),
        sa.Column("group_pk", sa.Integer(), nullable=False),
        sa.Column("judgments", sa.JSON(), nullable=False),
        sa.Column("advantages", sa.JSON(), nullable=False),
        sa.Column("usage", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["audit_pk"], ["audits.id"], name=op.f("fk_audit_groups_audit_pk_audits"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["group_pk"], ["groups.id"], name=op.f("fk_audit_groups_group_pk_groups"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_groups")),
        sa.UniqueConstraint("audit_pk", "group_pk", name=op.f("uq_audit_groups_audit_pk_group_pk")),
    )


def downgrade() -> None:
    op.drop_table("audit_groups")
    op.drop_index("ix_audits_tenant_created", table_name="audits")
    op.drop_table("audits")
