"""process advantage pinned to A_rg, unscorable turns, judge outages

The API (docs/api.md) pins ``process_advantage`` to the normalized credit A_rg and names the discounted
value ``discounted_process_advantage``: the columns are renamed to say so (the old
``normalized_credit`` held A_rg, the old ``process_advantage`` held D). Turns get the
``unscorable`` flag (docs/method.md, "Judge failures"); groups record a wait on an unreachable judge; the
``judge_endpoints`` table keeps each endpoint's last known state.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("turns") as batch_op:
        batch_op.alter_column("process_advantage", new_column_name="discounted_process_advantage")
    with op.batch_alter_table("turns") as batch_op:
        batch_op.alter_column("normalized_credit", new_column_name="process_advantage")
        batch_op.add_column(sa.Column("unscorable", sa.Boolean(), nullable=False, server_default=sa.text("false")))
    with op.batch_alter_table("groups") as batch_op:
        batch_op.add_column(sa.Column("judge_waiting_since", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("judge_waiting_reason", sa.Text(), nullable=True))
    op.create_table(
        "judge_endpoints",
        sa.Column("endpoint", sa.String(length=512), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("outages", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("endpoint", name=op.f("pk_judge_endpoints")),
    )


def downgrade() -> None:
    op.drop_table("judge_endpoints")
    with op.batch_alter_table("groups") as batch_op:
        batch_op.drop_column("judge_waiting_reason")
        batch_op.drop_column("judge_waiting_since")
    with op.batch_alter_table("turns") as batch_op:
        batch_op.drop_column("unscorable")
        batch_op.alter_column("process_advantage", new_column_name="normalized_credit")
    with op.batch_alter_table("turns") as batch_op:
        batch_op.alter_column("discounted_process_advantage", new_column_name="process_advantage")
