"""A circuit breaker per judge endpoint: a judge that cannot be reached is waited for.

The method (docs/method.md, "Judge failures") tells a judge that answered badly (invalid output, a 4xx) from one that
cannot be reached (connection refused, DNS, timeouts, 5xx and 429 storms). A judgment
whose retries all end unreachable opens the breaker instead of being recorded as failed.
While it is open no judgment spends attempts: each waits, and one at a time is let
through as a probe, at growing intervals. The first answer of any kind closes it and
every waiter resumes with its full attempt budget. Past the deadline, counted from the
start of the outage, waiters raise :class:`JudgeUnavailable` and their groups fail with
that reason.

Waiters poll the state a few times a second rather than waiting on an asyncio event, so
the breaker serves the engine's loop and the short-lived loops of synchronous calls.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

#: Attempt outcomes that say nothing about the request, only that the judge is not serving.
UNREACHABLE_OUTCOMES = frozenset({"connection", "timeout", "server_error", "rate_limited"})

log = logging.getLogger(__name__)

#: Longest a waiter sleeps between looks at the breaker (the resume latency after a close).
_POLL_S = 0.2


class JudgeUnavailable(Exception):
    """The judge stayed unreachable past the outage deadline."""

    def __init__(self, endpoint: str, since: datetime, reason: str | None, deadline_s: float):
        self.endpoint, self.since, self.reason, self.deadline_s = endpoint, since, reason, deadline_s
        super().__init__(
            f"judge {endpoint} unreachable since {since.isoformat(timespec='seconds')}, "
            f"past the {deadline_s:g} s outage deadline (DRCREDIT_JUDGE_OUTAGE_DEADLINE_S): {reason}"
        )


@dataclass(frozen=True)
class BreakerState:
    endpoint: str
    up: bool
    #: When the current state began (the outage's start while down).
    since: datetime
    #: The last unreachable error while down.
    reason: str | None
    outages: int


class CircuitBreaker:
    def __init__(
        self,
        endpoint: str,
        deadline_s: float = 600.0,
        probe_initial_s: float = 0.5,
        probe_max_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.endpoint = endpoint
        self.deadline_s = deadline_s
        self.probe_initial_s = probe_initial_s
        self.probe_max_s = probe_max_s
        self._clock = clock
        self._lock = threading.Lock()
        self._open = False
        self._since = datetime.now(UTC)
        self._down_at = 0.0
        self._reason: str | None = None
        self._interval = probe_initial_s
        self._next_probe = 0.0
        self._probing = False
        self._outages = 0
        self._listeners: list[Callable[[BreakerState], None]] = []

    # ------------------------------------------------------------------ reading

    @property
    def is_open(self) -> bool:
        return self._open

    def state(self) -> BreakerState:
        with self._lock:
            return self._state()

    def _state(self) -> BreakerState:
        return BreakerState(self.endpoint, not self._open, self._since, self._reason, self._outages)

    def add_listener(self, listener: Callable[[BreakerState], None]) -> None:
        """Called with the new state on every open and close (from the reporting thread)."""
        self._listeners.append(listener)

    # ------------------------------------------------------------------ reports

    def reachable(self) -> None:
        """The judge answered (whatever it said): close the breaker if it was open."""
        if not self._open:  # the common case, without the lock
            return
        with self._lock:
            if not self._open:
                return
            self._open, self._probing = False, False
            self._since, self._reason = datetime.now(UTC), None
            self._interval = self.probe_initial_s
            state = self._state()
        self._notify(state)

    def unreachable(self, reason: str, *, probe: bool = False) -> None:
        """A judgment's retries (or a probe) ended without reaching the judge."""
        with self._lock:
            now = self._clock()
            if probe:
                self._probing = False
            if self._open:
                self._reason = reason
                if probe:
                    self._interval = min(self.probe_max_s, self._interval * 2)
                    self._next_probe = now + self._interval
                return
            self._open = True
            self._since, self._down_at, self._reason = datetime.now(UTC), now, reason
            self._outages += 1
            self._interval = self.probe_initial_s
            self._next_probe = now + self._interval
            state = self._state()
        self._notify(state)

    def probe_finished(self) -> None:
        """A probe ended without a report (cancelled, or an error of ours): let another go."""
        with self._lock:
            self._probing = False

    # ------------------------------------------------------------------ waiting

    async def acquire(self) -> bool:
        """Return at once while closed (False); while open, wait for the close (False) or
        for this caller's turn to probe (True). Raises :class:`JudgeUnavailable` past the
        deadline."""
        while True:
            if not self._open:
                return False
            with self._lock:
                if not self._open:
                    return False
                now = self._clock()
                if now - self._down_at >= self.deadline_s:
                    raise JudgeUnavailable(self.endpoint, self._since, self._reason, self.deadline_s)
                if not self._probing and now >= self._next_probe:
                    self._probing = True
                    return True
                wake = min(self._next_probe, self._down_at + self.deadline_s)
            await asyncio.sleep(min(_POLL_S, max(0.01, wake - now)))

    def down_for(self) -> timedelta:
        with self._lock:
            return timedelta(seconds=self._clock() - self._down_at) if self._open else timedelta(0)

    def _notify(self, state: BreakerState) -> None:
        for listener in self._listeners:
            try:
                listener(state)
            except Exception:
                log.warning("a judge state listener failed", exc_info=True)
