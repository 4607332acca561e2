"""Wake long-polls when groups finish, instead of polling the database for them.

A trainer long-polls a step's advantages (``?wait=``) for the whole step. Polling the
groups' statuses several times a second cost the API a third of its CPU in the
benchmark and added up to a poll interval to every answer. Instead, whatever finishes
or fails a group reports it here, and waiters re-read the database only then:

- in this process (embedded mode, or a worker that aggregates) through
  :meth:`GroupEvents.finished`;
- across processes on Postgres through ``NOTIFY`` on :data:`CHANNEL`, sent in the
  transaction that makes the group final (so it is delivered only if that commits),
  and received by a :class:`NotificationListener` in the API process.

A notification is only a hint to look again: waiters read the statuses from the
database, and fall back to polling (slowly while the listener is connected, quickly
while it is not), so a lost notification costs latency, never a wrong answer. When the
listener loses or regains its connection every waiter looks again at once: a group that
finished meanwhile was announced to nobody.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import text
from sqlalchemy.orm import Session

log = logging.getLogger("drcredit.events")

#: The Postgres channel on which a group id is announced when the group becomes final.
CHANNEL = "drcredit_group_final"

#: How long a waiter sleeps between reads when no notification arrives: long while a
#: listener (or the process itself) reports completions, short when nothing does. Every
#: recheck is a read per waiting client: with hundreds of long-polls, 2 s here was a
#: read every few milliseconds competing with the answers.
RECHECK_NOTIFIED_S = 10.0
RECHECK_POLLING_S = 0.1


class _Subscription:
    """The groups one waiter waits for; woken once every one of them was reported."""

    def __init__(self, group_pks: Iterable[int]):
        self.loop = asyncio.get_running_loop()
        self.watched = frozenset(group_pks)
        self.pending = set(self.watched)
        self.all_reported = asyncio.Event()
        if not self.pending:
            self.all_reported.set()

    def report(self, group_pk: int) -> None:  # on the waiter's loop
        self.pending.discard(group_pk)
        if not self.pending:
            self.all_reported.set()

    def still_pending(self, group_pks: Iterable[int]) -> None:  # on the waiter's loop
        """Wait only for these: a read after subscribing found the others final, and a
        group that became final before the subscription was reported to nobody."""
        self.pending.intersection_update(group_pks)
        if not self.pending:
            self.all_reported.set()


class GroupEvents:
    """Completion reports for the long-polls of one process (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscriptions: dict[int, set[_Subscription]] = {}
        #: Every group finishes in this process (embedded mode): all reports are local.
        self.local = False
        #: A listener is connected and receives the other processes' reports.
        self.listening = False

    @property
    def recheck_s(self) -> float:
        return RECHECK_NOTIFIED_S if self.local or self.listening else RECHECK_POLLING_S

    def finished(self, group_pks: Iterable[int]) -> None:
        """Report groups that became final (from any thread)."""
        with self._lock:
            woken = [(sub, pk) for pk in group_pks for sub in self._subscriptions.get(pk, ())]
        self._report(woken)

    def everyone_look_again(self) -> None:
        """Wake every waiter to read the statuses again (a report may have been missed)."""
        with self._lock:
            woken = [(sub, pk) for pk, subs in self._subscriptions.items() for sub in subs]
        self._report(woken)

    @staticmethod
    def _report(woken: list[tuple[_Subscription, int]]) -> None:
        for sub, pk in woken:
            try:
                sub.loop.call_soon_threadsafe(sub.report, pk)
            except RuntimeError:  # the waiter's loop has closed: nobody is waiting
                continue

    @contextmanager
    def watching(self, group_pks: Iterable[int]) -> Iterator[_Subscription]:
        """Subscribe before reading the statuses, so no report in between is missed."""
        sub = _Subscription(group_pks)
        with self._lock:
            for pk in sub.pending:
                self._subscriptions.setdefault(pk, set()).add(sub)
        try:
            yield sub
        finally:
            with self._lock:
                for pk in sub.watched:
                    subs = self._subscriptions.get(pk)
                    if subs is not None:
                        subs.discard(sub)
                        if not subs:
                            del self._subscriptions[pk]

    async def wait(self, sub: _Subscription, timeout: float) -> None:
        """Until every group of ``sub`` was reported, or ``timeout`` (or the recheck time)."""
        try:
            await asyncio.wait_for(sub.all_reported.wait(), max(0.0, min(timeout, self.recheck_s)))
        except TimeoutError:
            pass


def announce_final(s: Session, group_pk: int) -> None:
    """Tell every listening process, when ``s`` commits, that the group became final."""
    if s.get_bind().dialect.name == "postgresql":
        s.execute(text("SELECT pg_notify(:channel, :pk)"), {"channel": CHANNEL, "pk": str(group_pk)})


class NotificationListener(threading.Thread):
    """Receives :data:`CHANNEL` notifications on its own connection and reports them.

    Reconnects with backoff when the connection drops; while it is down, waiters poll.
    """

    def __init__(self, conninfo: str, events: GroupEvents):
        super().__init__(name="drcredit-notifications", daemon=True)
        self.conninfo = conninfo
        self.events = events
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.events.listening = True
                    self.events.everyone_look_again()
                    backoff = 0.5
                    while not self._stopping.is_set():
                        for note in conn.notifies(timeout=1.0):
                            if note.payload.isdigit():
                                self.events.finished([int(note.payload)])
            except Exception:
                if not self._stopping.is_set():
                    log.warning("completion notifications lost; long-polls poll until reconnected", exc_info=True)
            finally:
                if self.events.listening:
                    self.events.listening = False
                    # Until reconnected, waiters poll: wake them to start.
                    self.events.everyone_look_again()
            deadline = time.monotonic() + backoff
            while not self._stopping.is_set() and time.monotonic() < deadline:
                self._stopping.wait(0.1)
            backoff = min(backoff * 2, 10.0)
