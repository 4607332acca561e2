"""The Alembic migrations build exactly the schema the models describe, both ways."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, select, text
from sqlalchemy.orm import Session

from drcredit.storage import models as m
from drcredit.storage.histories import support_histories
from drcredit.storage.migrate import downgrade, upgrade
from drcredit.storage.models import Base


def schema_differences(url: str) -> list[object]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(compare_metadata(MigrationContext.configure(conn), Base.metadata))
    finally:
        engine.dispose()


def columns(url: str, table: str) -> set[str]:
    engine = create_engine(url)
    try:
        return {c["name"] for c in inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


def test_the_migrations_at_head_match_the_models(database_url: str) -> None:
    upgrade(database_url)
    assert schema_differences(database_url) == []


def test_revision_0002_adds_outlines_and_payloads_and_goes_back_cleanly(database_url: str) -> None:
    upgrade(database_url, "0001")
    assert "outline" not in columns(database_url, "rollouts")
    upgrade(database_url, "0002")
    assert "outline" in columns(database_url, "rollouts")
    assert "payload" in columns(database_url, "work_units")
    downgrade(database_url, "0001")
    assert "outline" not in columns(database_url, "rollouts")
    assert "payload" not in columns(database_url, "work_units")
    upgrade(database_url)
    assert schema_differences(database_url) == []
    downgrade(database_url, "0001")  # through 0003's downgrade too
    upgrade(database_url)
    assert schema_differences(database_url) == []


def _rows(url: str, sql: str) -> list[tuple[object, ...]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(sql))]
    finally:
        engine.dispose()


def test_revision_0003_carries_attempts_and_support_histories_over_and_back(database_url: str) -> None:
    url = database_url  # an empty database, SQLite or Postgres (tests/conftest.py)
    upgrade(url, "0002")
    engine = create_engine(url)
    with engine.begin() as conn:
        group_pk = conn.execute(
            text(
                "INSERT INTO groups (tenant, group_id, content_hash, question, rubrics, params, expected_rollouts,"
                " rollouts_received, status, judge_backend, judge_model, judgments_planned, units_total, units_done,"
                " aggregation, created_at, updated_at) VALUES ('t', 'g', 'h', 'q', '[]', '{}', 2, 2, 'done', 'openai',"
                " 'm', 3, 1, 1, 'done', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP) RETURNING id"
            )
        ).scalar_one()
        judgments = [
            # turn, level, status, support points (as the judge gave them), prior support
            (0, 2, "ok", '["a", "b"]', 0),
            (1, 0, "ok", "[]", 2),
            (2, 1, "ok", '["c"]', 2),
            (3, None, "failed", None, 3),
        ]
        ids = []
        for turn, level, status, points, prior in judgments:
            ids.append(
                conn.execute(
                    text(
                        "INSERT INTO judgments (group_pk, kind, rollout_id, turn_index, rubric_id, status, level,"
                        " support_points, prior_support, cache_hit, attempt_count, created_at) VALUES (:g, 'visit',"
                        " 'r0', :t, 'R1', :s, :l, :p, :prior, false, 2, CURRENT_TIMESTAMP) RETURNING id"
                    ),
                    {"g": group_pk, "t": turn, "s": status, "l": level, "p": points, "prior": prior},
                ).scalar_one()
            )
        for judgment_pk in ids:
            for number, outcome in ((2, "ok"), (1, "timeout")):  # inserted out of order on purpose
                conn.execute(
                    text(
                        "INSERT INTO judgment_attempts (judgment_pk, number, outcome, error, latency_s, prompt_tokens,"
                        " completion_tokens) VALUES (:j, :n, :o, :e, 0.5, 10, 2)"
                    ),
                    {"j": judgment_pk, "n": number, "o": outcome, "e": None if outcome == "ok" else "slow"},
                )
        for position, turn, point in ((0, 0, "a"), (1, 0, "b"), (2, 2, "c")):
            conn.execute(
                text(
                    "INSERT INTO support_points (group_pk, rollout_id, rubric_id, position, turn_index, text)"
                    " VALUES (:g, 'r0', 'R1', :pos, :t, :x)"
                ),
                {"g": group_pk, "pos": position, "t": turn, "x": point},
            )
    engine.dispose()
    attempts_before = _rows(url, "SELECT judgment_pk, number, outcome, error FROM judgment_attempts ORDER BY 1, 2")
    points_before = _rows(url, "SELECT position, turn_index, text FROM support_points ORDER BY position")

    upgrade(url)
    engine = create_engine(url)
    with Session(engine) as s:
        stored = {j.id: j.attempts for j in s.scalars(select(m.Judgment))}
        histories = support_histories(s, [group_pk])
    engine.dispose()
    assert {pk: [(a["number"], a["outcome"], a["error"]) for a in attempts] for pk, attempts in stored.items()} == {
        pk: [(1, "timeout", "slow"), (2, "ok", None)] for pk in ids
    }
    assert histories == {(group_pk, "r0", "R1"): [(t, x) for _, t, x in points_before]}

    downgrade(url, "0002")
    assert (
        _rows(url, "SELECT judgment_pk, number, outcome, error FROM judgment_attempts ORDER BY 1, 2") == attempts_before
    )
    assert _rows(url, "SELECT position, turn_index, text FROM support_points ORDER BY position") == points_before


def test_revision_0007_adds_the_stored_advantages_document_and_goes_back_cleanly(database_url: str) -> None:
    upgrade(database_url, "0006")
    assert "advantages_json" not in columns(database_url, "groups")
    upgrade(database_url, "0007")
    assert "advantages_json" in columns(database_url, "groups")
    downgrade(database_url, "0006")
    assert "advantages_json" not in columns(database_url, "groups")
    upgrade(database_url)
    assert schema_differences(database_url) == []


def test_revision_0008_adds_judgment_usage_with_defaults_for_old_rows_and_goes_back_cleanly(database_url: str) -> None:
    url = database_url
    upgrade(url, "0007")
    usage_columns = {"cached_prompt_tokens", "estimated_prompt_tokens", "endpoint", "served_model"}
    assert not usage_columns & columns(url, "judgments")
    engine = create_engine(url)
    with engine.begin() as conn:
        group_pk = conn.execute(
            text(
                "INSERT INTO groups (tenant, group_id, content_hash, question, rubrics, params, expected_rollouts,"
                " rollouts_received, status, judge_backend, judge_model, judgments_planned, units_total, units_done,"
                " aggregation, advantages_json, created_at, updated_at) VALUES ('t', 'g', 'h', 'q', '[]', '{}', 2, 2,"
                " 'done', 'openai', 'm', 1, 1, 1, 'done', '{\"group_id\": \"g\"}', CURRENT_TIMESTAMP,"
                " CURRENT_TIMESTAMP) RETURNING id"
            )
        ).scalar_one()
        conn.execute(
            text(
                "INSERT INTO judgments (group_pk, kind, rollout_id, turn_index, rubric_id, status, level, cache_hit,"
                " model, prompt_tokens, completion_tokens, attempt_count, created_at) VALUES (:g, 'visit', 'r0', 0,"
                " 'R1', 'ok', 2, false, 'm', 120, 30, 1, CURRENT_TIMESTAMP)"
            ),
            {"g": group_pk},
        )
    engine.dispose()
    upgrade(url, "0008")
    assert usage_columns <= columns(url, "judgments")
    # A judgment stored before: no cached or estimated tokens, no endpoint or served model.
    assert _rows(
        url,
        "SELECT prompt_tokens, completion_tokens, cached_prompt_tokens, estimated_prompt_tokens, endpoint,"
        " served_model, model FROM judgments",
    ) == [(120, 30, 0, 0, None, None, "m")]
    # The document stored without usage is dropped: the API builds it from the rows.
    assert _rows(url, "SELECT advantages_json FROM groups") == [(None,)]
    downgrade(url, "0007")
    assert not usage_columns & columns(url, "judgments")
    assert _rows(url, "SELECT prompt_tokens, completion_tokens, model FROM judgments") == [(120, 30, "m")]
    upgrade(url)
    assert schema_differences(url) == []


def test_revision_0013_adds_audit_budget_holds_and_goes_back_cleanly(database_url: str) -> None:
    url = database_url
    upgrade(url, "0012")
    held = {"held_until", "held_for"}
    assert not held & columns(url, "audits")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO audits (audit_id, tenant, judge, scope, seed, status, group_ids, created_at)"
                " VALUES ('aud-1', 't', 'j', '{}', 0, 'queued', '[]', CURRENT_TIMESTAMP)"
            )
        )
    engine.dispose()
    upgrade(url, "0013")
    assert held <= columns(url, "audits")
    # An audit stored before is not held.
    assert _rows(url, "SELECT audit_id, status, held_until, held_for FROM audits") == [("aud-1", "queued", None, None)]
    downgrade(url, "0012")
    assert not held & columns(url, "audits")
    assert _rows(url, "SELECT audit_id, status FROM audits") == [("aud-1", "queued")]
    upgrade(url)
    assert schema_differences(url) == []
