"""The batch writer: every unit's judgments, lease renewals and finishes, many per transaction.

A unit stores each answer before it asks its next question (a lost worker loses at most
what was in flight). Writes from all units of the process are gathered for a short
linger and committed together: judgments first (one multi-row insert; a duplicate
delivery's row is reported, not an error), then the leases they renew (a lease that
passed on makes the write ``lost``), then, under the group row locks taken in id order,
the waiting snippet calls the judgments decide, the units they finish, and the
exactly-once flip that hands a group whose every unit is done to aggregation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence

from drcredit.scoring.dispatch import Dispatcher
from drcredit.scoring.engine import BatchWriter, Engine
from drcredit.scoring.work.leases import LeaseKeeper
from drcredit.scoring.work.snippet_release import SnippetRelease
from drcredit.scoring.work.units import StoreOutcome, Write
from drcredit.storage import repository as repo
from drcredit.storage.bulk import store_judgments
from drcredit.storage.database import Database, is_connection_error, retry_lock_conflicts, utcnow

log = logging.getLogger("drcredit.writes")


class JudgmentWriter:
    """:meth:`put` a :class:`Write` from the engine loop; it returns once committed."""

    def __init__(
        self,
        db: Database,
        engine: Engine,
        dispatcher: Dispatcher,
        leases: LeaseKeeper,
        snippets: SnippetRelease,
        stopping: threading.Event,
        *,
        store_patience_s: float,
        linger_s: float,
    ):
        self.db = db
        self.dispatcher = dispatcher
        self.leases = leases
        self.snippets = snippets
        self.stopping = stopping
        self.store_patience_s = store_patience_s
        self._batches: BatchWriter[Write, StoreOutcome] = BatchWriter(engine, self.write_batch, linger_s=linger_s)

    async def put(self, write: Write) -> StoreOutcome:
        return await self._batches.put(write)

    def write_batch(self, writes: Sequence[Write]) -> list[StoreOutcome]:
        """:meth:`write_batch_once`, run again when the server aborted it to break a
        deadlock, and kept until the database is back when it is away.

        Judge answers are the expensive part: an outage of the database must not make
        the platform ask them again. A batch that failed to commit is written again as
        a whole; one whose commit went through unacknowledged finds its judgments
        stored (``duplicate``) and its chains read where they stand.
        """
        deadline = time.monotonic() + self.store_patience_s
        pause = 0.25
        while True:
            try:
                return retry_lock_conflicts(self.write_batch_once, writes)
            except Exception as exc:
                if not is_connection_error(exc) or time.monotonic() + pause > deadline or self.stopping.is_set():
                    raise
                log.warning("database unavailable; keeping %d judge answers and trying again", len(writes))
                time.sleep(pause)
                pause = min(pause * 2, 5.0)

    def write_batch_once(self, writes: Sequence[Write]) -> list[StoreOutcome]:
        """Store judgments, renew leases and finish units, for many units in one transaction."""
        outcomes: list[StoreOutcome] = ["stored"] * len(writes)
        flipped: list[int] = []
        with self.db.session() as s:
            judged = [(i, w) for i, w in enumerate(writes) if w.judgment is not None]
            if judged:
                stored = store_judgments(s, [w.judgment for _, w in judged])  # type: ignore[misc]
                leases = [w.lease for n, (_, w) in enumerate(judged) if n in stored and w.lease is not None]
                kept = self.leases.keep(s, leases)
                for n, (i, w) in enumerate(judged):
                    if n not in stored:
                        outcomes[i] = "duplicate"
                    elif w.lease is not None and w.lease[0] not in kept:
                        outcomes[i] = "lost"
            # Group rows are locked (in id order, as in every transaction that locks
            # them) only now, for the short rest of the transaction. The lock also orders
            # concurrent batches of a group: a release decided after it reads every
            # judgment committed before, so no waiting snippet call is left behind.
            repo.lock_groups(
                s, {w.finish[1] for w in writes if w.finish} | {w.release[0][0] for w in writes if w.release}
            )
            stamp = utcnow()
            releases = dict(w.release for w in writes if w.release is not None)
            to_dispatch, done_by_skip = self.snippets.decide(s, releases, stamp) if releases else ([], Counter())
            # A unit finishes with its last judgment only if that judgment is ours and stored.
            finishing = [w.finish[0] for i, w in enumerate(writes) if w.finish is not None and outcomes[i] == "stored"]
            done = Counter(repo.finish_units(s, finishing, stamp)) + done_by_skip
            repo.add_units_done(s, done, stamp)
            flipped = repo.flip_aggregation(s, set(done), stamp)
        if to_dispatch:
            self.dispatcher.dispatch(to_dispatch)
        for group_pk in flipped:
            self.dispatcher.dispatch_aggregation(group_pk)
        return outcomes
