"""How many calls an endpoint is sent at once: learned from what it serves.

The rule is TCP's congestion control, applied to judge calls instead of packets. The
limit starts small and grows fourfold with every round of answers that come back at
normal latency (slow start: :data:`SLOW_START_GAIN` more calls per answer), until the
endpoint first pushes back;
from then on it grows by :data:`PROBE_GAIN` calls per round (additive increase) and is
cut on each push-back (multiplicative decrease): by :data:`ERROR_CUT` on a 429, a 5xx,
a connect failure or a timeout, by :data:`LATENCY_CUT` when answers slow down because
calls queue inside the server. Growth and the latency cut both need the endpoint busy
(half a process's share in flight): only then is the limit what the answers' pace
says something about. A cut applies once per round: answers to calls sent before the
last cut say nothing about the new limit (the ``epoch``).

The state is a plain value, fleet-wide per endpoint (shared between processes through
:mod:`drcredit.judges.fleet.store`); this module only computes the next one.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace

#: Calls in flight to an endpoint before anything is known of it (fleet-wide).
INITIAL_LIMIT = 64.0
#: Calls added per answer at normal latency during slow start: the limit grows fourfold
#: per round. A round is one judge latency, and a step lasts only as many rounds as its
#: longest chain (11 in the benchmarks' step) while its first wave is every chain at
#: once (1,650 there): doubling from 32 (TCP's rule) spent five of those rounds finding
#: room, and a fresh deployment's first step took 1.25-1.37x its bound (BENCHMARKS.md,
#: eighteenth round). Starting higher instead sent an unknown slow replica, or a small
#: quota, a whole first wave.
SLOW_START_GAIN = 3.0
#: Never fewer than this in flight (a limit of 0 could never learn again).
MIN_LIMIT = 1.0
#: Additive increase, in calls per round of answers, once past slow start.
PROBE_GAIN = 4.0
#: Multiplicative decrease on an error push-back (429, 5xx, connect failure, timeout).
ERROR_CUT = 0.7
#: Multiplicative decrease when calls queue inside the server (latency inflation).
LATENCY_CUT = 0.9
#: An answer is late when the recent median latency exceeds this multiple of the base.
INFLATION = 2.0
#: Answers the recent median is taken over.
RECENT = 16
#: Weight of each answer in the base latency's slow rise (it falls at once).
BASE_RISE = 0.01


@dataclass(frozen=True)
class LimitState:
    """An endpoint's learned concurrency, shared by every process calling it."""

    limit: float = INITIAL_LIMIT
    #: Slow start ends here (infinite until the endpoint first pushes back).
    ssthresh: float = math.inf
    #: Counts the cuts; a call remembers the epoch it was sent in.
    epoch: int = 0
    #: An upper bound: the server's declared slots or the operator's max_concurrency.
    cap: float | None = None

    @property
    def slow_start(self) -> bool:
        return self.limit < self.ssthresh

    def bounded(self, limit: float) -> float:
        top = self.cap if self.cap is not None else math.inf
        return max(MIN_LIMIT, min(limit, top))


def grow(state: LimitState, answers: float) -> LimitState:
    """``answers`` calls came back at normal latency while the endpoint was busy."""
    if answers <= 0:
        return state
    limit = state.limit
    if state.slow_start:
        room = state.ssthresh - limit
        step = min(answers * SLOW_START_GAIN, room)
        limit += step
        answers -= step / SLOW_START_GAIN
    if answers > 0:
        limit += PROBE_GAIN * answers / max(limit, 1.0)
    return replace(state, limit=state.bounded(limit))


def cut(state: LimitState, sent_epoch: int, factor: float) -> LimitState:
    """The endpoint pushed back on a call sent in ``sent_epoch``: one cut per round."""
    if sent_epoch < state.epoch:
        return state
    limit = state.bounded(state.limit * factor)
    return replace(state, limit=limit, ssthresh=limit, epoch=state.epoch + 1)


def relearned(state: LimitState, before: float | None = None) -> LimitState:
    """The endpoint is back after an outage. The cuts its outage caused (its calls failing
    to connect until it was taken out) say nothing of its capacity: it gets back
    ``before``, the limit it had when it last answered (a restarted replica is usually
    the same server), and at least :data:`INITIAL_LIMIT`, and slow start resumes (it may
    be a larger server now), in a new round (answers to calls sent before cannot cut it).
    Kept at the cut value, a replica restarted after a kill came back at one call and
    served none of the next step's first third (BENCHMARKS.md, eighteenth round)."""
    limit = state.bounded(max(state.limit, before or 0.0, INITIAL_LIMIT))
    return replace(state, limit=limit, ssthresh=math.inf, epoch=state.epoch + 1)


def capped(state: LimitState, cap: float | None) -> LimitState:
    """A declared capacity (server slots, operator's max): the limit never exceeds it."""
    if cap == state.cap:
        return state
    limited = replace(state, cap=cap)
    return replace(limited, limit=limited.bounded(state.limit))


class LatencyWatch:
    """Tells answers slowed by queueing inside the server from the server's own pace.

    The base is a low-water mark of the recent median latency: it follows the median
    down at once and up only slowly (:data:`BASE_RISE` per answer), so a server that is
    simply slow has a slow base, while calls piling up in its queue show as a recent
    median far above the base (:data:`INFLATION`). Per process and endpoint.
    """

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=RECENT)
        self.base: float | None = None
        #: Smoothed latency of answers (the router's estimate of the endpoint's pace).
        self.ewma: float | None = None

    def observe(self, latency_s: float) -> bool:
        """Record an answer's latency; True when the endpoint is answering late."""
        self.ewma = latency_s if self.ewma is None else self.ewma + 0.2 * (latency_s - self.ewma)
        self._recent.append(latency_s)
        if len(self._recent) < RECENT:
            return False
        median = sorted(self._recent)[RECENT // 2]
        if self.base is None or median < self.base:
            self.base = median
            return False
        self.base += BASE_RISE * (median - self.base)
        return median > INFLATION * self.base

    def forget_recent(self) -> None:
        """After a cut: the next verdict waits for answers to calls sent under the new limit."""
        self._recent.clear()
