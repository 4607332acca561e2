"""rollout outlines and snippet call payloads

Aggregation and replay read a rollout's outline (its turns without their text) instead
of its turn bodies, and a snippet call carries its eligible results, so that neither
the aggregator nor the snippet matcher loads a rollout's pages. Both columns are
nullable: rows stored before this revision are read the old way.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 21:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rollouts") as batch_op:
        batch_op.add_column(sa.Column("outline", sa.JSON(), nullable=True))
    with op.batch_alter_table("work_units") as batch_op:
        batch_op.add_column(sa.Column("payload", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("work_units") as batch_op:
        batch_op.drop_column("payload")
    with op.batch_alter_table("rollouts") as batch_op:
        batch_op.drop_column("outline")
