"""labels: people's values for the keys an audit compares

One row per (tenant, group, kind, key, labeler): a label given again by the same
labeler replaces the value. No existing table changes.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 10:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "labels",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("group_pk", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("rollout_id", sa.String(length=256), nullable=False),
        sa.Column("turn_index", sa.Integer(), nullable=False),
        sa.Column("key_id", sa.String(length=256), nullable=False),
        sa.Column("labeler", sa.String(length=128), nullable=False),
        sa.Column("value", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["group_pk"], ["groups.id"], name=op.f("fk_labels_group_pk_groups"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_labels")),
        sa.UniqueConstraint(
            "tenant", "group_pk", "kind", "rollout_id", "turn_index", "key_id", "labeler", name="uq_labels_item_labeler"
        ),
    )
    op.create_index("ix_labels_tenant_labeler", "labels", ["tenant", "labeler"])
    op.create_index("ix_labels_group_pk", "labels", ["group_pk"])


def downgrade() -> None:
    op.drop_index("ix_labels_group_pk", table_name="labels")
    op.drop_index("ix_labels_tenant_labeler", table_name="labels")
    op.drop_table("labels")
