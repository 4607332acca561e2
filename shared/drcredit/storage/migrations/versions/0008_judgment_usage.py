"""a judgment records its cached and estimated prompt tokens and who answered it

Judge usage is summed in SQL over judgments (docs/api.md, "Judge usage and cost"): the
cached part of the prompt tokens and the part the platform estimated get columns of
their own, beside ``prompt_tokens`` and ``completion_tokens``, and so do the endpoint and
the model the server said answered (``model`` stays the configured one). Judgments stored
before this revision count 0 cached and estimated tokens and name no endpoint or served
model: their attempts (JSON) are left as they were.

The advantages documents stored before this revision have no ``usage``: they are
dropped, and the API builds a done group's document from its rows when it has none
stored (as for groups finished before 0007), usage included.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("judgments") as batch_op:
        batch_op.add_column(sa.Column("served_model", sa.String(256), nullable=True))
        batch_op.add_column(sa.Column("endpoint", sa.String(512), nullable=True))
        batch_op.add_column(
            sa.Column("cached_prompt_tokens", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
        batch_op.add_column(
            sa.Column("estimated_prompt_tokens", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
    op.execute("UPDATE groups SET advantages_json = NULL WHERE advantages_json IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table("judgments") as batch_op:
        batch_op.drop_column("estimated_prompt_tokens")
        batch_op.drop_column("cached_prompt_tokens")
        batch_op.drop_column("endpoint")
        batch_op.drop_column("served_model")
