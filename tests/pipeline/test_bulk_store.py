"""The bulk judgment store and the leases, on SQLite and on Postgres."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from drcredit.storage import models as m
from drcredit.storage.bulk import JudgmentRow, copy_rows, held_leases, renew_leases, store_judgments
from drcredit.storage.database import Database
from drcredit.storage.histories import support_histories
from drcredit.storage.migrate import upgrade
from tests.support.infra import postgres_database

# ----------------------------------------------------------------------------- bulk store


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'bulk.sqlite3'}"
        upgrade(url)
        database = Database(url)
        yield database
        database.dispose()
    else:
        with postgres_database() as url:
            upgrade(url)
            database = Database(url)
            yield database
            database.dispose()


def _group(db: Database) -> int:
    with db.session() as s:
        row = m.Group(
            tenant="t",
            group_id="g",
            content_hash="h",
            question="q",
            rubrics=[],
            params={},
            expected_rollouts=2,
            judge_backend="offline",
            judge_model="m",
        )
        s.add(row)
        s.flush()
        return row.id


def _row(group_pk: int, turn: int, level: int, points: list[str], prior: int, status: str = "ok") -> JudgmentRow:
    return JudgmentRow(
        {
            "group_pk": group_pk,
            "kind": "visit",
            "rollout_id": "r0",
            "turn_index": turn,
            "rubric_id": "R1",
            "status": status,
            "level": level,
            "support_points": points,
            "answer": {"level": level},
            "prior_support": prior,
            "cache_hit": False,
            "attempt_count": 1,
            "attempts": [
                {
                    "number": 1,
                    "outcome": "ok",
                    "error": None,
                    "latency_s": 0.5,
                    "prompt_tokens": 10,
                    "completion_tokens": 2,
                }
            ],
            "created_at": datetime.now(UTC),
        }
    )


def test_store_skips_what_is_stored_and_histories_read_back_in_turn_order(db: Database) -> None:
    group_pk = _group(db)
    with db.session() as s:
        assert store_judgments(s, [_row(group_pk, 0, 2, ["a", "b"], 0), _row(group_pk, 1, 0, [], 2)]) == {0, 1}
    # A second delivery stores turn 1 again (skipped) together with turns 2 and 3 (new);
    # turn 3 failed: whatever it holds is not support.
    with db.session() as s:
        stored = store_judgments(
            s,
            [
                _row(group_pk, 1, 0, [], 2),
                _row(group_pk, 3, 1, ["x"], 3, status="failed"),
                _row(group_pk, 2, 1, ["c"], 2),
            ],
        )
        assert stored == {1, 2}
    with db.session() as s:
        judgments = s.execute(
            select(m.Judgment.turn_index, m.Judgment.level, m.Judgment.answer, m.Judgment.attempts)
        ).all()
        histories = support_histories(s, [group_pk])
    assert sorted((t, lvl) for t, lvl, _, _ in judgments) == [(0, 2), (1, 0), (2, 1), (3, 1)]
    assert all(answer == {"level": level} for _, level, answer, _ in judgments)
    assert all([a["number"] for a in attempts] == [1] for *_, attempts in judgments)
    assert histories == {(group_pk, "r0", "R1"): [(0, "a"), (0, "b"), (2, "c")]}


def test_copied_rows_read_back_as_written_json_included(db: Database) -> None:
    group_pk = _group(db)
    with db.session() as s:
        rollout = m.Rollout(group_pk=group_pk, position=0, rollout_id="r0", content_hash="h")
        s.add(rollout)
        s.flush()
        rollout_pk = rollout.id
    # Text COPY has its own escapes (backslash, tab, newline): page text carries them all.
    awkward = {"type": "visit", "evidence": 'a\tb\n "quoted" back\\slash \\t é 中', "n": None}
    bodies = [awkward, {"type": "answer", "answer": "plain"}]
    with db.session() as s:
        copy_rows(
            s,
            m.Turn.__table__,
            ("rollout_pk", "index", "type", "body"),
            [(rollout_pk, i, b["type"], b) for i, b in enumerate(bodies)],
        )  # type: ignore[arg-type]
    with db.session() as s:
        stored = s.execute(select(m.Turn.index, m.Turn.type, m.Turn.body).order_by(m.Turn.index)).all()
    assert [(i, t, b) for i, t, b in stored] == [(i, b["type"], b) for i, b in enumerate(bodies)]


def test_a_lease_is_held_only_by_its_owner_while_running_and_renewal_moves_its_expiry(db: Database) -> None:
    group_pk = _group(db)
    expires = datetime(2030, 1, 1, tzinfo=UTC)
    with db.session() as s:
        units = [
            m.WorkUnit(
                group_pk=group_pk,
                kind="visit_chain",
                unit_key=f"u{k}",
                rollout_id="r0",
                rubric_id="R1",
                status=status,
                lease_owner="me",
                lease_expires_at=expires,
            )
            for k, status in enumerate(["running", "running", "cancelled"])
        ]
        s.add_all(units)
        s.flush()
        mine, other, cancelled = (u.id for u in units)
    asked = [(mine, "me"), (other, "someone else"), (cancelled, "me")]
    with db.session() as s:
        assert held_leases(s, asked) == {mine}
    later = datetime(2031, 1, 1, tzinfo=UTC)
    with db.session() as s:
        assert renew_leases(s, asked, later) == {mine}
    with db.session() as s:
        stored = {
            pk: at and at.replace(tzinfo=UTC)
            for pk, at in s.execute(select(m.WorkUnit.id, m.WorkUnit.lease_expires_at))
        }
    assert stored == {mine: later, other: expires, cancelled: expires}


def test_a_renewal_takes_its_units_in_id_order(db: Database) -> None:
    """Every transaction locking units takes them in id order, so two never wait on each
    other. Unit 20 is written before unit 10 (a scan meets it first); another
    transaction holds unit 10; the renewal of both waits for 10 and must not have taken
    20 meanwhile."""
    if db.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer at a time: no row locks to order")
    group_pk = _group(db)
    expires = datetime(2030, 1, 1, tzinfo=UTC)
    with db.session() as s:
        for unit_id in (20, 10):
            s.add(
                m.WorkUnit(
                    id=unit_id,
                    group_pk=group_pk,
                    kind="visit_chain",
                    unit_key=f"u{unit_id}",
                    rollout_id="r0",
                    rubric_id="R1",
                    status="running",
                    lease_owner="me",
                    lease_expires_at=expires,
                )
            )
            s.flush()
    later = datetime(2031, 1, 1, tzinfo=UTC)
    renewed: list[set[int]] = []
    with db.engine.connect() as other:
        other.exec_driver_sql("SELECT id FROM work_units WHERE id = 10 FOR UPDATE")

        def renew() -> None:
            with db.session() as s:
                renewed.append(renew_leases(s, [(20, "me"), (10, "me")], later))

        thread = threading.Thread(target=renew)
        thread.start()
        thread.join(0.5)
        assert thread.is_alive()  # waiting for unit 10
        # Unit 20 is free: the renewal waits for 10 before it takes 20.
        assert other.exec_driver_sql("SELECT id FROM work_units WHERE id = 20 FOR UPDATE NOWAIT").scalar() == 20
        other.rollback()
    thread.join(10)
    assert renewed == [{10, 20}]
