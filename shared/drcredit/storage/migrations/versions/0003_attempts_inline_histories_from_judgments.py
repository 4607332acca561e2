"""attempts inline, support histories read from the judgments

A judgment's attempts move into a JSON column of its row, and the support_points table
goes: a rubric's support history is the support points of its level 1 and 2 visit
judgments in turn order, which the judgments already store. A stored judgment is then
one row with two index entries (primary key, uniqueness) instead of about two and a
half rows with six; the request_key index only holds the requests that can have a twin.
Existing attempts and histories are carried over both ways.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 23:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_ATTEMPT_FIELDS = ("number", "outcome", "error", "latency_s", "prompt_tokens", "completion_tokens")


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    with op.batch_alter_table("judgments") as batch_op:
        batch_op.add_column(sa.Column("attempts", sa.JSON(), nullable=True))
    fields = ", ".join(f"'{f}', {f}" for f in _ATTEMPT_FIELDS)
    if postgres:
        op.execute(
            f"""
            UPDATE judgments SET attempts = a.list
            FROM (SELECT judgment_pk, json_agg(json_build_object({fields}) ORDER BY number) AS list
                  FROM judgment_attempts GROUP BY judgment_pk) AS a
            WHERE a.judgment_pk = judgments.id
            """
        )
    else:
        op.execute(
            f"""
            UPDATE judgments SET attempts = (
                SELECT json_group_array(json(item)) FROM (
                    SELECT json_object({fields}) AS item FROM judgment_attempts
                    WHERE judgment_pk = judgments.id ORDER BY number))
            WHERE EXISTS (SELECT 1 FROM judgment_attempts WHERE judgment_pk = judgments.id)
            """
        )
    op.execute("UPDATE judgments SET attempts = '[]' WHERE attempts IS NULL")
    with op.batch_alter_table("judgments") as batch_op:
        batch_op.drop_index("ix_judgments_request_key")
        batch_op.create_index(
            "ix_judgments_request_key",
            ["group_pk", "request_key"],
            postgresql_where=sa.text("request_key IS NOT NULL"),
            sqlite_where=sa.text("request_key IS NOT NULL"),
        )
    op.drop_table("judgment_attempts")
    op.drop_table("support_points")


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "support_points",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("group_pk", sa.Integer(), nullable=False),
        sa.Column("rollout_id", sa.String(length=256), nullable=False),
        sa.Column("rubric_id", sa.String(length=256), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("turn_index", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["group_pk"], ["groups.id"], name=op.f("fk_support_points_group_pk_groups"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_support_points")),
        sa.UniqueConstraint(
            "group_pk",
            "rollout_id",
            "rubric_id",
            "position",
            name=op.f("uq_support_points_group_pk_rollout_id_rubric_id_position"),
        ),
    )
    op.create_table(
        "judgment_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("judgment_pk", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("latency_s", sa.Float(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["judgment_pk"], ["judgments.id"], name=op.f("fk_judgment_attempts_judgment_pk_judgments"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_judgment_attempts")),
        sa.UniqueConstraint("judgment_pk", "number", name=op.f("uq_judgment_attempts_judgment_pk_number")),
    )
    judged_with_points = "j.kind = 'visit' AND j.status = 'ok' AND j.level > 0"
    if postgres:
        op.execute(
            """
            INSERT INTO judgment_attempts (judgment_pk, number, outcome, error, latency_s, prompt_tokens,
                                           completion_tokens)
            SELECT j.id, a.number, a.outcome, a.error, a.latency_s, a.prompt_tokens, a.completion_tokens
            FROM judgments AS j CROSS JOIN LATERAL json_to_recordset(j.attempts)
                AS a(number int, outcome text, error text, latency_s float8, prompt_tokens int, completion_tokens int)
            """
        )
        op.execute(
            f"""
            INSERT INTO support_points (group_pk, rollout_id, rubric_id, position, turn_index, text)
            SELECT j.group_pk, j.rollout_id, j.rubric_id, COALESCE(j.prior_support, 0) + p.ordinality - 1,
                   j.turn_index, p.value
            FROM judgments AS j CROSS JOIN LATERAL json_array_elements_text(j.support_points)
                WITH ORDINALITY AS p(value, ordinality)
            WHERE {judged_with_points}
            """
        )
    else:
        op.execute(
            """
            INSERT INTO judgment_attempts (judgment_pk, number, outcome, error, latency_s, prompt_tokens,
                                           completion_tokens)
            SELECT j.id, json_extract(a.value, '$.number'), json_extract(a.value, '$.outcome'),
                   json_extract(a.value, '$.error'), json_extract(a.value, '$.latency_s'),
                   json_extract(a.value, '$.prompt_tokens'), json_extract(a.value, '$.completion_tokens')
            FROM judgments AS j, json_each(j.attempts) AS a
            """
        )
        op.execute(
            f"""
            INSERT INTO support_points (group_pk, rollout_id, rubric_id, position, turn_index, text)
            SELECT j.group_pk, j.rollout_id, j.rubric_id, COALESCE(j.prior_support, 0) + p.key, j.turn_index, p.value
            FROM judgments AS j, json_each(j.support_points) AS p
            WHERE {judged_with_points}
            """
        )
    with op.batch_alter_table("judgments") as batch_op:
        batch_op.drop_index("ix_judgments_request_key")
        batch_op.create_index("ix_judgments_request_key", ["group_pk", "request_key"])
        batch_op.drop_column("attempts")
