"""groups belong to a training run and step

``metadata.run`` and ``metadata.step`` (documented keys of the free ``metadata``) are kept
in columns of their own, so that a run's groups are found by an index, not by reading
every group's JSON. Groups stored before this revision get them from their metadata.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 18:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("groups") as batch_op:
        batch_op.add_column(sa.Column("run", sa.String(128), nullable=True))
        batch_op.add_column(sa.Column("step", sa.BigInteger(), nullable=True))
        batch_op.create_index("ix_groups_tenant_run_step", ["tenant", "run", "step"])
    groups = sa.table("groups", sa.column("id", sa.Integer), sa.column("metadata", sa.JSON))
    conn = op.get_bind()
    for pk, metadata in conn.execute(sa.select(groups.c.id, groups.c.metadata)):
        if not isinstance(metadata, dict):
            continue
        run, step = metadata.get("run"), metadata.get("step")
        if not isinstance(run, str) or not 1 <= len(run) <= 128:
            continue
        conn.execute(
            sa.text("UPDATE groups SET run = :run, step = :step WHERE id = :id"),
            {"run": run, "step": step if isinstance(step, int) and not isinstance(step, bool) else None, "id": pk},
        )


def downgrade() -> None:
    with op.batch_alter_table("groups") as batch_op:
        batch_op.drop_index("ix_groups_tenant_run_step")
        batch_op.drop_column("step")
        batch_op.drop_column("run")
