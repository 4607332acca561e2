"""What an endpoint's answers say of its queue: the latency when nothing queues (the
*base*) and the verdict of the recent answers against it.

A server with ``n`` slots that was sent ``load`` calls answers them in ``load / n``
service times (Little's law), so an answer's latency over the base says how deep the
queue it met was, and ``load x base / latency`` estimates the slots. Per process and
endpoint; :mod:`~drcredit.judges.fleet.limits` decides what a verdict does to the limit.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

#: In slow start, one answer over this multiple of the base does not grow the limit: a
#: queue of one service time per slot is 2x, and waiting for the median let slow start
#: send a 32-slot server ten times its slots.
SLOW_START_INFLATION = 1.5
#: Answers the recent median is taken over.
RECENT = 16
#: The base is this low quantile of the last :data:`BASE_MEMORY` medians of the recent
#: answers: low enough to be the latency when nothing queues (each cut lets the queue
#: drain), high enough that a noisy server's luckiest windows do not set it. A running
#: minimum did: it only fell, and a lognormal judge's limit sank to half its slots.
BASE_QUANTILE = 0.1
BASE_MEMORY = 256


class Verdict(NamedTuple):
    """What the recent answers say of the server's queue."""

    #: Their median latency over the base.
    ratio: float
    #: The median of the calls in flight (fleet-wide) when they were sent.
    load: float
    #: The slots they imply (Little's law): the median of ``load x base / latency``.
    slots: float


def verdict_of(samples: Sequence[tuple[float, float]], base: float) -> Verdict:
    """``samples``: (latency, load at sending) of recent answers; ``base``: the latency
    of the server when nothing queues."""
    middle = len(samples) // 2
    latency = sorted(lat for lat, _ in samples)[middle]
    load = sorted(load for _, load in samples)[middle]
    slots = sorted(load * base / lat for lat, load in samples if lat > 0)[middle]
    return Verdict(latency / base, load, slots)


class LatencyWatch:
    """Tells answers slowed by queueing inside the server from the server's own pace.

    The base is a low quantile (:data:`BASE_QUANTILE`) of the medians of the recent
    answers over the last :data:`BASE_MEMORY` answers (each median, where the window
    mixes light and heavy loads, from the answers sent with the fewest calls ahead): it
    follows a faster server at once and a slower one within that memory. Per process
    and endpoint.

    Once the endpoint has been cut for queueing, the base is held: it follows a faster
    server still, but rises only when :meth:`rebase` says the server itself slowed. At
    64 answers a second the memory is 4-8 s, and a queue growing by the additive
    increase's few calls a round carried the base up with the latency: no answer read as
    late and a 64-slot server was sent 325 calls at once (BENCHMARKS.md, round 20).
    """

    def __init__(self) -> None:
        self._recent: deque[tuple[float, float]] = deque(maxlen=RECENT)
        self._medians: deque[float] = deque(maxlen=BASE_MEMORY)
        self.base: float | None = None
        #: Smoothed latency of answers (the router's estimate of the endpoint's pace).
        self.ewma: float | None = None
        #: The last verdict acted on was a queue cut.
        self.after_queue_cut = False
        #: The quickest answer yet (the base's stand-in before there is one).
        self.fastest: float | None = None
        #: The highest the base may be since the first queue cut (None: not held).
        self.held: float | None = None

    def _light_median(self) -> float:
        """The median latency of the answers sent with at most half the window's median
        load (math.inf with fewer than three): in a first wave sent at once into a few
        slots, the window's own median is already queued, and these are the calls that
        met the fewest ahead of them."""
        loads = sorted(load for _, load in self._recent)
        light = sorted(lat for lat, load in self._recent if load <= loads[len(loads) // 2] / 2)
        return light[len(light) // 2] if len(light) >= 3 else math.inf

    def track(self, latency_s: float) -> None:
        """An answer's latency for the router's pace only (its call was sent before a cut)."""
        self.ewma = latency_s if self.ewma is None else self.ewma + 0.2 * (latency_s - self.ewma)
        self.fastest = latency_s if self.fastest is None else min(self.fastest, latency_s)

    def observe(self, latency_s: float, load: float = 1.0) -> Verdict | None:
        """Record an answer's latency and the calls in flight when it was sent; the
        recent answers' verdict (None until there are :data:`RECENT` of them)."""
        self.track(latency_s)
        self._recent.append((latency_s, load))
        if len(self._recent) < RECENT:
            return None
        median = sorted(lat for lat, _ in self._recent)[RECENT // 2]
        self._medians.append(min(median, self._light_median()))
        self.base = sorted(self._medians)[int(len(self._medians) * BASE_QUANTILE)]
        if self.held is not None:
            self.base = min(self.base, self.held)
        return verdict_of(self._recent, self.base)

    def late(self, latency_s: float) -> bool:
        """This answer alone is over :data:`SLOW_START_INFLATION` of the base (before there is one,
        of the median of the first answers, once there are a few)."""
        reference = self.base
        if reference is None and len(self._recent) >= RECENT // 4:
            reference = sorted(lat for lat, _ in self._recent)[len(self._recent) // 2]
        return reference is not None and latency_s > SLOW_START_INFLATION * reference

    def hold(self) -> None:
        """A queue cut: from now on the base does not rise past what it is (until
        :meth:`rebase`); it may still fall (a faster server, the queue drained)."""
        if self.base is not None:
            self.held = self.base if self.held is None else min(self.held, self.base)

    def forget_recent(self) -> None:
        """After a cut: the next verdict waits for answers to calls sent under the new limit."""
        self._recent.clear()

    def rebase(self) -> None:
        """The server itself is slower now: its base is the recent median."""
        if self._recent:
            self.base = sorted(lat for lat, _ in self._recent)[len(self._recent) // 2]
            self._medians.clear()
            self._medians.append(self.base)
            self.held = self.base if self.held is not None else None
        self._recent.clear()
        self.after_queue_cut = False
