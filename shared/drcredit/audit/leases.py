"""Who runs an audit: its claim under a lease, the lease's renewal (which also counts
the run's spend: :mod:`.spend`) and return, and the sweep that sends a lost audit again.

A queued audit held for its tenant's budget (``held_until`` set) is neither claimed nor
swept: only the budget's release (:func:`drcredit.tenancy.budgets.release_due_audits`)
sends it, at the reset.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from drcredit.storage import models as m
from drcredit.storage.database import Database, rows_changed

log = logging.getLogger("drcredit.audit")

#: How long a running audit's claim holds without renewal (renewed every quarter of it).
LEASE_S = 60.0

#: Queued and not held for a budget: free to claim or send.
_STARTABLE = (m.Audit.status == "queued") & m.Audit.held_until.is_(None)


def claim(db: Database, audit_pk: int, owner: str) -> bool:
    """Take the audit to run it (queued and not held, or running under a lease that ran out)."""
    now = datetime.now(UTC)
    with db.session() as s:
        result = s.execute(
            update(m.Audit)
            .where(
                m.Audit.id == audit_pk,
                _STARTABLE | ((m.Audit.status == "running") & (m.Audit.lease_expires_at < now)),
            )
            .values(
                status="running",
                lease_owner=owner,
                lease_expires_at=now + timedelta(seconds=LEASE_S),
                started_at=now,
            )
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]


def renew(db: Database, audit_pk: int, owner: str, also: Callable[[Session], None] | None = None) -> bool:
    """Renew ``owner``'s lease and, in the same transaction, do ``also`` (count the run's
    spend: :mod:`.spend`); False, and ``also`` not done, when the lease is no longer
    ``owner``'s."""
    with db.session() as s:
        renewed = (
            update(m.Audit)
            .where(m.Audit.id == audit_pk, m.Audit.lease_owner == owner)
            .values(lease_expires_at=datetime.now(UTC) + timedelta(seconds=LEASE_S))
        )
        if not rows_changed(s, renewed):
            return False
        if also is not None:
            also(s)
    return True


def give_back(db: Database, audit_pk: int, owner: str) -> str:
    """Give the claim back: the audit stays running, its lease out, for the next start."""
    with db.session() as s:
        s.execute(
            update(m.Audit)
            .where(m.Audit.id == audit_pk, m.Audit.lease_owner == owner)
            .values(lease_expires_at=datetime.now(UTC))
        )
    log.info("audit %s stopped with its process; the next start or sweep runs it again", audit_pk)
    return "stopped"


def sweep(db: Database, dispatch: Callable[[int], None], stale_after_s: float) -> int:
    """Dispatch again the audits whose message or worker was lost: queued (not held) for
    longer than ``stale_after_s``, or running under a lease that ran out."""
    now = datetime.now(UTC)
    with db.session() as s:
        ids = list(
            s.scalars(
                select(m.Audit.id).where(
                    (_STARTABLE & (m.Audit.created_at < now - timedelta(seconds=stale_after_s)))
                    | ((m.Audit.status == "running") & (m.Audit.lease_expires_at < now))
                )
            )
        )
    for audit_pk in ids:
        dispatch(audit_pk)
    return len(ids)
