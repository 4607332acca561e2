"""An audit whose message or worker was lost is sent again, and runs once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from drcredit.audit import service
from drcredit.storage import models as m
from drcredit.storage.database import Database
from drcredit.storage.migrate import upgrade


def _audit(db: Database, status: str, created_ago_s: float, lease_in_s: float | None) -> int:
    now = datetime.now(UTC)
    with db.session() as s:
        row = m.Audit(
            audit_id=f"aud-{status}-{created_ago_s}-{lease_in_s}",
            tenant="t",
            judge="j",
            scope={"run": "r"},
            seed=0,
            status=status,
            group_ids=[],
            created_at=now - timedelta(seconds=created_ago_s),
            lease_expires_at=None if lease_in_s is None else now + timedelta(seconds=lease_in_s),
        )
        s.add(row)
        s.flush()
        return row.id


def test_lost_audits_are_sent_again_and_claimed_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.sqlite3'}"
    upgrade(url)
    db = Database(url, 2)
    try:
        fresh = _audit(db, "queued", 1, None)
        old = _audit(db, "queued", 120, None)
        lost = _audit(db, "running", 300, -5)
        alive = _audit(db, "running", 300, 30)
        done = _audit(db, "done", 300, None)
        sent: list[int] = []
        assert service.sweep(db, sent.append, 60) == 2
        assert sorted(sent) == sorted([old, lost])
        # The lost one is taken by one delivery only; a live lease is not taken.
        assert service.claim(db, lost, "w1") and not service.claim(db, lost, "w2")
        assert not service.claim(db, alive, "w3") and not service.claim(db, done, "w4")
        assert service.claim(db, fresh, "w5")
    finally:
        db.dispose()
