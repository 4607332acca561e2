"""outcome reward computed by the service

A rollout of a group with ``outcome_source: judge`` keeps what its outcome reward reads
(``outcome_facts``, written at ingest) and, once aggregated, the reward's breakdown
(``outcome``). Outcome judgments are rows of ``judgments`` (kinds ``rubric`` and
``citation``) and outcome units rows of ``work_units`` (kind ``outcome``): no new table.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rollouts") as batch_op:
        batch_op.add_column(sa.Column("outcome_facts", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("outcome", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollouts") as batch_op:
        batch_op.drop_column("outcome")
        batch_op.drop_column("outcome_facts")
