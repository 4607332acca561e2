"""This process's leases on running work units, and the heartbeat that keeps them.

A unit runs under a lease (``work_units.lease_owner``/``lease_expires_at``) so that a
second delivery does nothing while the first is alive, and the sweeper can take over a
unit whose worker died. A lease is checked (a read) with every batch that stores the
unit's judgments and renewed there once a quarter of it has passed; a unit that stores
nothing for a while (a long judge call, a judge outage) is renewed by the heartbeat, so
a lease never has to be long enough to cover the judge: it only has to outlast a few
heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from drcredit.storage.bulk import held_leases, renew_leases
from drcredit.storage.database import Database

log = logging.getLogger("drcredit.leases")


class LeaseKeeper:
    def __init__(self, db: Database, lease_s: float, run_db: Callable[..., Any]):
        """``run_db(fn, *args)``: an awaitable running ``fn`` on a database thread."""
        self.db = db
        self.lease_s = lease_s
        self._run_db = run_db
        #: When this process last set each of its leases (monotonic seconds).
        self._set_at: dict[int, float] = {}
        #: The units running here and the owner token of their delivery.
        self._held: dict[int, str] = {}
        self._heartbeat: asyncio.Task[None] | None = None

    @property
    def renew_after_s(self) -> float:
        return self.lease_s / 4

    def taken(self, unit_ids: Sequence[int], owner: str) -> None:
        """Leases just set by a claim (from a database thread)."""
        stamp = time.monotonic()
        for unit_id in unit_ids:
            self._set_at[unit_id] = stamp
            self._held[unit_id] = owner

    def dropped(self, unit_id: int) -> None:
        """The unit stopped running here (done, handed back, lost or failed)."""
        self._held.pop(unit_id, None)
        self._set_at.pop(unit_id, None)

    def keep(self, s: Session, leases: Sequence[tuple[int, str]]) -> set[int]:
        """The leases still held; those a quarter through their time are renewed too.

        Renewing after every judgment rewrote a unit's row per judgment, the second
        largest share of the database's work per call. Checking is a read.
        """
        started = time.monotonic()
        due: list[tuple[int, str]] = []
        not_due: list[tuple[int, str]] = []
        for lease in leases:
            late = started - self._set_at.get(lease[0], 0.0) > self.renew_after_s
            (due if late else not_due).append(lease)
        kept = held_leases(s, not_due)
        if due:
            renewed = renew_leases(s, due, datetime.now(UTC) + timedelta(seconds=self.lease_s))
            for unit_id in renewed:
                self._set_at[unit_id] = started
            kept |= renewed
        return kept

    def ensure_heartbeat(self) -> None:
        """Start the heartbeat on the running (engine) loop, once."""
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat())

    async def stop(self) -> None:
        """Stop the heartbeat (on the engine loop, as the engine closes)."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, self.renew_after_s / 2))
            try:
                await self.renew_due()
            except Exception:
                log.warning("could not renew the leases of running units", exc_info=True)

    async def renew_due(self) -> int:
        """Renew the leases a quarter through their time; returns how many were renewed."""
        now = time.monotonic()
        due = [
            (unit_id, owner)
            for unit_id, owner in list(self._held.items())
            if now - self._set_at.get(unit_id, 0.0) > self.renew_after_s
        ]
        if not due:
            return 0
        renewed: set[int] = await self._run_db(self._renew, due)
        for unit_id, _ in due:
            if unit_id in renewed:
                self._set_at[unit_id] = now
            else:
                # Taken over or cancelled: the unit's next store finds it lost.
                self._held.pop(unit_id, None)
        return len(renewed)

    def _renew(self, leases: list[tuple[int, str]]) -> set[int]:
        with self.db.session() as s:
            return renew_leases(s, leases, datetime.now(UTC) + timedelta(seconds=self.lease_s))
