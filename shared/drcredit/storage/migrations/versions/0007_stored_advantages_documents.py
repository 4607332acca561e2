"""a done group keeps its advantages document

Aggregation stores the group's advantages document (the JSON the API serves) in
``groups.advantages_json`` in the transaction that makes it done, so a long-poll answers
from one column. Groups finished before this revision have none; the API builds theirs
from the turn rows, as before.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 23:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("groups") as batch_op:
        batch_op.add_column(sa.Column("advantages_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("groups") as batch_op:
        batch_op.drop_column("advantages_json")
