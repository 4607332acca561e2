"""audit budget holds: judge audits held for their tenant's budget

``audits.held_until`` / ``held_for``: a judge audit accepted past a budget with
``on_budget: wait`` stays queued, neither sent nor claimed, until the budget's reset
(as ``groups.held_until`` since 0011). No data changes: every stored audit is unheld.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 09:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("audits") as batch:
        batch.add_column(sa.Column("held_until", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("held_for", sa.String(length=32), nullable=True))
    op.create_index("ix_audits_held_until", "audits", ["held_until"])


def downgrade() -> None:
    op.drop_index("ix_audits_held_until", table_name="audits")
    with op.batch_alter_table("audits") as batch:
        batch.drop_column("held_for")
        batch.drop_column("held_until")
