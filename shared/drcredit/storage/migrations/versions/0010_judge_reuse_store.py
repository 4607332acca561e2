"""judge answers kept for reuse, and each judgment's prompt layout and reuse

``judge_answers`` keeps valid judge answers by tenant and request digest (the model,
the messages, the response format and the sampling parameters), so that an identical
request of another group of the tenant is answered from it instead of the judge
(docs/judges.md, "Reuse"). A judgment records the layout its prompt was rendered in
(``prompt_layout``, null for judgments stored before this revision) and whether it was
answered from that store (``reused``, false for the earlier ones).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 11:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "judge_answers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("backend", sa.String(length=32), nullable=False),
        sa.Column("served_model", sa.String(length=256), nullable=True),
        sa.Column("endpoint", sa.String(length=512), nullable=True),
        sa.Column("answer", sa.JSON(), nullable=True),
        sa.Column("verdict", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_judge_answers")),
        sa.UniqueConstraint("tenant", "digest", name=op.f("uq_judge_answers_tenant_digest")),
    )
    op.create_index("ix_judge_answers_created_at", "judge_answers", ["created_at"])
    with op.batch_alter_table("judgments") as batch_op:
        batch_op.add_column(sa.Column("reused", sa.Boolean(), nullable=False, server_default=sa.text("false")))
        batch_op.add_column(sa.Column("prompt_layout", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("judgments") as batch_op:
        batch_op.drop_column("prompt_layout")
        batch_op.drop_column("reused")
    op.drop_index("ix_judge_answers_created_at", table_name="judge_answers")
    op.drop_table("judge_answers")
