"""An audit whose message or worker was lost is sent again, and runs once; one held for
its tenant's budget is neither sent nor taken until the budget's release."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from drcredit.audit import leases
from drcredit.scoring.dispatch import UnitRef
from drcredit.storage import models as m
from drcredit.storage.database import Database
from drcredit.storage.migrate import upgrade
from drcredit.tenancy.budgets import release_due_audits


def _audit(
    db: Database, status: str, created_ago_s: float, lease_in_s: float | None, held_for_s: float | None = None
) -> int:
    """An audit row; ``held_for_s``: held for a budget that resets in that many seconds."""
    now = datetime.now(UTC)
    with db.session() as s:
        row = m.Audit(
            audit_id=f"aud-{status}-{created_ago_s}-{lease_in_s}-{held_for_s}",
            tenant="t",
            judge="j",
            scope={"run": "r"},
            seed=0,
            status=status,
            group_ids=[],
            created_at=now - timedelta(seconds=created_ago_s),
            lease_expires_at=None if lease_in_s is None else now + timedelta(seconds=lease_in_s),
            held_until=None if held_for_s is None else now + timedelta(seconds=held_for_s),
            held_for=None if held_for_s is None else "tokens_per_day",
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
        assert leases.sweep(db, sent.append, 60) == 2
        assert sorted(sent) == sorted([old, lost])
        # The lost one is taken by one delivery only; a live lease is not taken.
        assert leases.claim(db, lost, "w1") and not leases.claim(db, lost, "w2")
        assert not leases.claim(db, alive, "w3") and not leases.claim(db, done, "w4")
        assert leases.claim(db, fresh, "w5")
    finally:
        db.dispose()


class Sent:
    """A dispatcher that records the audits it is asked to send."""

    def __init__(self) -> None:
        self.audits: list[int] = []

    def dispatch(self, units: Sequence[UnitRef]) -> None:
        raise AssertionError("no unit is sent")

    def dispatch_aggregation(self, group_pk: int) -> None:
        raise AssertionError("no group is sent")

    def dispatch_audit(self, audit_pk: int) -> None:
        self.audits.append(audit_pk)


def test_a_held_audit_is_neither_swept_nor_claimed_until_its_budget_releases_it(database_url: str) -> None:
    upgrade(database_url)
    db = Database(database_url, 2)
    try:
        # Both queued long ago, as a lost one would be: one held for 30 s more, one whose
        # reset has just passed but that the release has not reached yet.
        later = _audit(db, "queued", 120, None, held_for_s=30)
        due = _audit(db, "queued", 120, None, held_for_s=-1)
        sent: list[int] = []
        assert leases.sweep(db, sent.append, 0) == 0 and sent == []
        assert not leases.claim(db, later, "w1") and not leases.claim(db, due, "w2")
        with db.session() as s:
            assert set(s.scalars(select(m.Audit.status).where(m.Audit.id.in_([later, due])))) == {"queued"}

        dispatcher = Sent()
        assert release_due_audits(db, dispatcher, datetime.now(UTC)) == [due]
        assert dispatcher.audits == [due]
        assert release_due_audits(db, dispatcher, datetime.now(UTC)) == [] and dispatcher.audits == [due]  # once
        # Released: a plain queued audit, swept if its message is lost and claimed once.
        assert leases.sweep(db, sent.append, 60) == 1 and sent == [due]
        assert leases.claim(db, due, "w3") and not leases.claim(db, due, "w4")
        assert not leases.claim(db, later, "w5")
        # At its own reset the other is released too.
        assert release_due_audits(db, dispatcher, datetime.now(UTC) + timedelta(seconds=31)) == [later]
        assert leases.claim(db, later, "w6")
    finally:
        db.dispose()
