"""What a running judge audit has spent, counted in its tenant's ledger while it runs.

An audit's calls are paid when they are made, not when its report is written. Counted
only at the end, a long audit's tokens were missing from ``/v1/usage`` and from every
budget check while it ran. A stopped or lost audit's calls were never counted at all,
though they had been paid. So the runner counts the calls as they come back:

- :class:`AuditSpend` sums the calls, judgments and tokens of each judgment the audit
  judge answers with a call of its own, as it is answered;
- :func:`count` adds what was spent since the last count to the tenant's ledger (at the
  bucket of now). It does this in the transaction that renews the audit's lease, and
  only while the lease is still this runner's. Each call is counted once, by the run that
  made it. A stopped run's calls stay counted, and the run that starts the audit again
  counts its own calls anew.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from drcredit.audit.leases import renew
from drcredit.domain.usage import Usage
from drcredit.scoring.results.usage import add_tenant_usage
from drcredit.storage.database import Database
from drcredit.tenancy.windows import bucket

#: How often a running audit counts its spend (and renews its lease).
COUNT_EVERY_S = 5.0


def attempts_usage(attempts: Iterable[Mapping[str, Any]]) -> Usage:
    """One judgment's calls (its attempts, as the audit records them) and their tokens."""
    made = list(attempts)
    return Usage(
        calls=len(made),
        prompt_tokens=sum(int(a.get("prompt_tokens") or 0) for a in made),
        completion_tokens=sum(int(a.get("completion_tokens") or 0) for a in made),
        cached_prompt_tokens=sum(int(a.get("cached_tokens") or 0) for a in made),
    )


class AuditSpend:
    """The running total of an audit's judge usage. Judgments are added on the engine's
    event loop and the total is read by the runner's thread, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = Usage()

    def add(self, attempts: Iterable[Mapping[str, Any]]) -> None:
        """A judgment answered with a call of its own (ok or failed), with its attempts."""
        used = attempts_usage(attempts) + Usage(judgments=1)
        with self._lock:
            self._total = self._total + used

    def total(self) -> Usage:
        with self._lock:
            return self._total


def count(
    db: Database, audit_pk: int, owner: str, tenant: str, uncounted: Usage, window_s: float | None = None
) -> bool:
    """Renew ``owner``'s lease on the audit and add ``uncounted`` to the tenant's ledger
    (at the bucket of now), in one transaction; False, and nothing added, when the lease
    is no longer ``owner``'s."""
    return renew(
        db, audit_pk, owner, lambda s: add_tenant_usage(s, tenant, bucket(datetime.now(UTC), window_s), uncounted)
    )
