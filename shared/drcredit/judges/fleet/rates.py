"""Requests and tokens per minute: what a hosted judge allows, and pacing calls under it.

A hosted API says what it allows in its answers' headers (OpenAI's
``x-ratelimit-limit-requests`` / ``-tokens`` per minute, ``-remaining-*`` and ``-reset-*``
for the current window) and, past it, answers 429 with ``retry-after`` (seconds or an
HTTP date) or ``retry-after-ms``. The operator may also set ``DRCREDIT_JUDGE_RPM`` and
``DRCREDIT_JUDGE_TPM``. Either way calls are paced by a GCRA (generic cell rate
algorithm) reservation: each call reserves its cost on a virtual schedule and waits until
its turn, so a fleet of processes sending through one shared schedule never exceeds
the rate and never polls. :func:`reserve` is that rule; the Redis store runs the same
rule in one script so that every process of a deployment shares the schedule.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

#: Burst tolerance of the pacing, in seconds of the rate: a call may start this much
#: ahead of its exact slot (the servers' own buckets allow a burst of about a second).
BURST_S = 0.1

#: Longest wait a ``retry-after`` is taken at; beyond, the endpoint is retried then.
MAX_RETRY_AFTER_S = 60.0

#: A judge that answers 429 without saying its rate: the rate it accepted over this
#: window before the 429, times :data:`INFERRED_MARGIN`, becomes its pace; while the pace
#: holds calls back and no 429 comes for :data:`QUIET_S`, it rises by :data:`RATE_PROBE`
#: per second, so a quota raised later is found again.
ACCEPTED_WINDOW_S = 2.0
INFERRED_MARGIN = 0.95
#: The shortest span a rate is measured over (a first burst says little). Refused again
#: at the pace just inferred, before that span: the pace is cut by :data:`RATE_CUT`, at
#: most once per :data:`RATE_CUT_SPACING_S`.
MIN_SPAN_S = 0.25
RATE_CUT = 0.8
RATE_CUT_SPACING_S = 0.05
QUIET_S = 2.0
RATE_PROBE = 0.05

_DURATION = re.compile(r"(?P<value>\d+(?:\.\d+)?)(?P<unit>ms|h|m|s)")


@dataclass(frozen=True)
class RateLimits:
    """Requests and tokens per minute (None: not limited, or not known)."""

    rpm: float | None = None
    tpm: float | None = None

    def __bool__(self) -> bool:
        return self.rpm is not None or self.tpm is not None


@dataclass(frozen=True)
class RateHeaders:
    """What one answer's headers say about the endpoint's rate limits."""

    limits: RateLimits
    #: Seconds until requests may be sent again (a 429's retry-after, or an exhausted window).
    wait_s: float | None = None


def reserve(tat: float, now: float, cost: float, rate_per_s: float, burst_s: float = BURST_S) -> tuple[float, float]:
    """Reserve ``cost`` units on a schedule advancing at ``rate_per_s``.

    ``tat`` is the schedule's theoretical arrival time (when the next unit is due).
    Returns the new ``tat`` and how long the caller waits before its call (0: now).
    """
    start = max(now, tat - burst_s)
    return max(tat, start) + cost / rate_per_s, start - now


def refund(tat: float, now: float, cost: float, rate_per_s: float) -> float:
    """Give back ``cost`` units reserved but not used (a token estimate above the usage)."""
    return max(now, tat - cost / rate_per_s)


def deferred(tat: float, now: float, seconds: float, burst_s: float = BURST_S) -> float:
    """The schedule after a 429 under it: the quota is empty now, so no call starts within
    ``seconds`` and the burst tolerance is spent (the schedule was ahead of the quota)."""
    return max(tat, now + seconds + burst_s)


def inferred_rpm(sent_at: Iterable[float], refused_at: Iterable[float], since: float, now: float) -> float | None:
    """Requests per minute a judge accepted from ``since`` (or its first call after it)
    to its 429, with a margin: the calls sent in that span less those it refused. A
    call still in flight counts as accepted (a quota refuses at once). None when the
    span is shorter than :data:`MIN_SPAN_S` or it accepted nothing.

    The first 429 measures over :data:`ACCEPTED_WINDOW_S` before it (a lower bound while
    the calls were still ramping up, an overstatement when the quota's bucket was full);
    every later one measures from the previous inference: the quota's bucket was empty
    at both 429s, so the calls it accepted in between are exactly what it refilled,
    however fast they were sent (unless it filled to the brim meanwhile).
    """
    sent = [t for t in sent_at if since <= t <= now]
    if not sent:
        return None
    span = now - min(sent)
    if span < MIN_SPAN_S:
        return None
    accepted = len(sent) - sum(1 for t in refused_at if since <= t <= now)
    if accepted <= 0:
        return None
    return 60.0 * accepted / span * INFERRED_MARGIN


#: A later 429 is measured from the previous one only if calls kept going in between: a
#: pause this long may have let the quota's bucket refill, and what it accepted then
#: understates its rate (a step's first 429, measured back to the previous step's last,
#: once set the pace to a sixth of the quota); such a 429 is measured as a first one.
MAX_SEND_GAP_S = 0.5


def longest_pause(sent_at: Iterable[float], since: float, now: float) -> float:
    """The longest time from ``since`` to ``now`` in which no call was sent."""
    previous, longest = since, 0.0
    for t in sent_at:
        if since <= t <= now:
            longest = max(longest, t - previous)
            previous = t
    return max(longest, now - previous)


#: The smallest part of a fleet's calls a process is taken to send (a process that holds
#: almost none of the demand says little of the fleet's rate).
MIN_FRACTION = 0.1


def fleet_rpm(own_rpm: float, fraction: float) -> float:
    """The endpoint's rate from what one process saw it accept: that process sends its
    ``fraction`` of the fleet's calls (its part of the demand), the others the rest, all
    on one schedule, so the endpoint accepted ``own_rpm / fraction`` in all."""
    return own_rpm / max(MIN_FRACTION, min(1.0, fraction))


def probed_rpm(rpm: float, seconds: float) -> float:
    """An inferred pace after ``seconds`` without a 429 while it held calls back."""
    return rpm * (1.0 + RATE_PROBE * seconds)


def read_headers(headers: Mapping[str, str], status: int, now: float | None = None) -> RateHeaders:
    """The rate facts in an answer's headers (names compared case-insensitively)."""
    lower = {k.lower(): v for k, v in headers.items()}
    limits = RateLimits(
        _number(lower.get("x-ratelimit-limit-requests")), _number(lower.get("x-ratelimit-limit-tokens"))
    )
    wait: float | None = None
    if status == 429:
        wait = _retry_after(lower, now)
    remaining = _number(lower.get("x-ratelimit-remaining-requests"))
    if wait is None and remaining is not None and remaining <= 0:
        # The window's reset is when it is full again, later than the next call may go:
        # a 429's own retry-after says that, and wins.
        wait = _duration(lower.get("x-ratelimit-reset-requests"))
    if wait is not None:
        wait = min(max(wait, 0.0), MAX_RETRY_AFTER_S)
    return RateHeaders(limits, wait)


def _retry_after(headers: Mapping[str, str], now: float | None) -> float | None:
    ms = _number(headers.get("retry-after-ms"))
    if ms is not None:
        return ms / 1000
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _number(value)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when.timestamp() - (now if now is not None else time.time())


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if number >= 0 else None


def _duration(value: str | None) -> float | None:
    """``"6m0s"``, ``"1.5s"``, ``"20ms"`` or plain seconds."""
    if value is None:
        return None
    plain = _number(value)
    if plain is not None:
        return plain
    text = value.strip()
    total, end = 0.0, 0
    for match in _DURATION.finditer(text):
        if match.start() != end:
            return None
        unit = match["unit"]
        total += float(match["value"]) * {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}[unit]
        end = match.end()
    return total if end == len(text) and end > 0 else None
