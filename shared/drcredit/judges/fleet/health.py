"""Whether one endpoint of the fleet takes calls: its own breaker.

An endpoint that fails :data:`FAILURES_TO_OPEN` calls in a row without answering (a
refused or dropped connection, a timeout, a 5xx), and has answered none for
:data:`ALIVE_WINDOW_S`, is taken out of the rotation; its calls go to the others. When
the last failure was a connection's, it is health-checked first and goes out only if
that check fails too: a few keep-alive connections the server had just closed, read
by a busy client, look like an endpoint gone (a single judge taken out that way sent
every call to the outage wait for seconds), and a check on a new connection tells. An
endpoint that answered a moment ago is alive: its failures then are push-back (a
flooded accept queue timing connections out while other calls get their answers), which
the limit answers (:mod:`drcredit.judges.fleet.limits`), not the rotation; taking it
out would send every call it has to the outage wait when it is the last one.

While out it is health-checked (a request of its own, not a judge call) at intervals
growing from :data:`PROBE_INITIAL_S` to :data:`PROBE_MAX_S`; any answer brings it back.
A 429 is an answer: the endpoint is alive and only asks for fewer calls. Only when every
endpoint is out is the judge unreachable, the outage the judge's own breaker
(:mod:`drcredit.judges.breaker`) waits out.
"""

from __future__ import annotations

from datetime import UTC, datetime

FAILURES_TO_OPEN = 3
#: An endpoint that answered within this many seconds is not taken out of the rotation.
ALIVE_WINDOW_S = 2.0
PROBE_INITIAL_S = 0.5
PROBE_MAX_S = 2.0


class EndpointHealth:
    """One process's view of one endpoint (engine loop only)."""

    def __init__(self) -> None:
        self.up = True
        self.failures = 0
        #: When the current state began (wall clock, for /readyz).
        self.since = datetime.now(UTC)
        self.reason: str | None = None
        self.probing = False
        self.next_probe = 0.0
        self._interval = PROBE_INITIAL_S
        #: Times it was taken out of the rotation.
        self.outages = 0
        #: When it last answered (the fleet's clock; None: not yet).
        self.answered_at: float | None = None
        #: Enough failures to take it out: a health check decides (while in the rotation).
        self.checking = False

    def answered(self, now: float) -> bool:
        """An answer of any kind; True when this brings the endpoint back."""
        self.failures = 0
        self.probing = False
        self.checking = False
        self.answered_at = now
        if self.up:
            return False
        self.up, self.since, self.reason = True, datetime.now(UTC), None
        self._interval = PROBE_INITIAL_S
        return True

    def answering_since(self, t: float) -> bool:
        """It answered a call after ``t`` (a call sent then and unanswered is queued, not lost)."""
        return self.answered_at is not None and self.answered_at >= t

    def failed(self, reason: str, now: float, *, probe: bool, connection: bool = False) -> bool:
        """A call or a health check ended without an answer; True when this takes the
        endpoint out. After a ``connection`` failure only a failed health check does
        (:meth:`check_wanted` asks for it)."""
        self.failures += 1
        self.reason = reason
        if probe:
            self.probing = False
        if not self.up:
            if probe:
                self._interval = min(PROBE_MAX_S, self._interval * 2)
                self.next_probe = now + self._interval
            return False
        if probe and self.checking:
            self.checking = False
            return self._take_out(now)
        if self.failures < FAILURES_TO_OPEN:
            return False
        if self.answered_at is not None and now - self.answered_at < ALIVE_WINDOW_S:
            return False  # alive: these failures are push-back
        if connection:
            self.checking = True
            return False
        return self._take_out(now)

    def _take_out(self, now: float) -> bool:
        self.up, self.since = False, datetime.now(UTC)
        self.outages += 1
        self._interval = PROBE_INITIAL_S
        self.next_probe = now + self._interval
        return True

    def check_wanted(self) -> bool:
        """True once when a health check must decide whether the endpoint goes out (the
        caller starts it)."""
        if not (self.up and self.checking) or self.probing:
            return False
        self.probing = True
        return True

    def probe_due(self, now: float) -> bool:
        return not self.up and not self.probing and now >= self.next_probe

    def start_probe(self) -> None:
        self.probing = True

    def probe_abandoned(self) -> None:
        """A probe ended without a verdict (cancelled): let another go."""
        self.probing = False
