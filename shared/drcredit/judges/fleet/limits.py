"""How many calls an endpoint is sent at once: learned from what it serves.

Growth is TCP's: the limit starts at :data:`INITIAL_LIMIT` and grows fourfold with every
round of answers that come back at normal latency (slow start: :data:`SLOW_START_GAIN`
more calls per answer) until the endpoint first pushes back; from then on it grows by
:data:`PROBE_GAIN` calls per round (additive increase). A 429, a 5xx or a connect
failure cuts it by :data:`ERROR_CUT` (multiplicative decrease).

Servers that queue (vLLM, SGLang, TGI: a fixed number of slots, every other call
waiting inside, first come first served, and nothing saying how many) are read the way
TCP Vegas reads a path: against the latency the server shows when nothing queues (the
*base*, a low quantile of the recent medians), an answer that took ``ratio`` times
longer was sent into a queue. By Little's law a server with ``n`` slots that was sent
``load`` calls answers them in ``load / n`` service times, so ``load x base / latency``
estimates its slots: on a late verdict (:data:`INFLATION`) the limit is set at once to
that estimate with :data:`HEADROOM` (not cut by a factor round after round: the queue
the first wave built would outlast the answer timeout); then it grows again by a few
calls a round until the next late verdict, so the limit stays between its slots and
twice as many, and the calls beyond wait in the platform (in priority order, no
timeout running). From the first queue cut the base may fall but no longer rise on
its own (:meth:`LatencyWatch.hold`): a queue growing a few calls a round would otherwise
carry it up with the latency, and no answer would ever read as late. A call that times
out while the endpoint answers others is a queue too: the slots are fewer than ``load x
base / timeout`` (:func:`timed_out`). A late verdict right after a queue cut, from calls
sent within the new limit, says the server itself slowed
(other clients, longer prompts): the base is learnt again instead of cutting twice.

Growth and the latency verdicts need the endpoint busy (half a process's share in
flight): only then is the limit what the answers' pace says something about. A cut
applies once per round: answers to calls sent before the last cut say nothing about the
new limit (the ``epoch``).

The state is a plain value, fleet-wide per endpoint (shared between processes through
:mod:`drcredit.judges.fleet.store`); this module only computes the next one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

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
#: Slow start's new room goes out over this fraction of a round (:func:`growth_pace`). A
#: 429 comes back in a round trip, not a judge latency, so half a round still stops the
#: growth at an unstated quota's first refusal; spread over a whole round it delayed the
#: critical chains that missed the first 64 calls by up to a round, twice (a fresh
#: deployment's first step 1.21x its bound, BENCHMARKS.md round 21).
SLOW_START_SPREAD = 0.5
#: Never fewer than this in flight (a limit of 0 could never learn again).
MIN_LIMIT = 1.0
#: Additive increase, in calls per round of answers, once past slow start.
PROBE_GAIN = 4.0
#: Multiplicative decrease on an error push-back (429, 5xx, connect failure, timeout).
ERROR_CUT = 0.7
#: Answers are late (calls queue inside the server) when their recent median exceeds
#: this multiple of the base. At 1.5 a worker short of CPU (answers read late by a busy
#: event loop) read as a queue: a replica taking over a killed one's calls was cut to a
#: fraction of its pace.
INFLATION = 2.0
#: In slow start, one answer over this multiple of the base does not grow the limit: a
#: queue of one service time per slot is 2x, and waiting for the median let slow start
#: send a 32-slot server ten times its slots.
SLOW_START_INFLATION = 1.5
#: The limit set on a late verdict: the estimated slots and this much more, so that a
#: slot freed is taken at once (each answer's round trip) and the estimate's noise
#: (a lognormal server's median) does not leave slots idle.
HEADROOM = 1.25
#: Answers the recent median is taken over.
RECENT = 16
#: The base is this low quantile of the last :data:`BASE_MEMORY` medians of the recent
#: answers: low enough to be the latency when nothing queues (each cut lets the queue
#: drain), high enough that a noisy server's luckiest windows do not set it. A running
#: minimum did: it only fell, and a lognormal judge's limit sank to half its slots.
BASE_QUANTILE = 0.1
BASE_MEMORY = 256


#: An endpoint that declares its rate is paced under it: its limit is at least the calls
#: that rate keeps in flight at the answers' latency, this many times over, from its first
#: answer (slow start from 64 sent a 150/s quota 81 calls a second for two seconds).
RATE_FLOOR_FACTOR = 2.0


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
    #: The endpoint was seen queueing calls (a late verdict or a timeout under load).
    queues: bool = False
    #: Its slots as last estimated from a queue (None: never seen queueing).
    slots: float | None = None

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


def queued(state: LimitState, sent_epoch: int, slots: float) -> LimitState:
    """Answers to calls sent in ``sent_epoch`` queued in a server estimated to have
    ``slots``: the limit becomes ``slots x HEADROOM`` (never raised by this), slow start
    ends, a new round begins."""
    if sent_epoch < state.epoch:
        return state
    limit = state.bounded(min(state.limit, slots * HEADROOM))
    return replace(state, limit=limit, ssthresh=limit, epoch=state.epoch + 1, queues=True, slots=slots)


def timed_out(state: LimitState, sent_epoch: int, load: float, base: float | None, waited_s: float) -> LimitState:
    """A call sent with ``load`` calls in flight got no answer in ``waited_s`` while the
    endpoint answered others: it sat in the server's queue. Then ``load x base /
    waited_s`` bounds the slots from above; the limit becomes that bound with
    :data:`HEADROOM`, and at most ``ERROR_CUT`` of what it was (the bound alone when no
    base is known yet would be nothing)."""
    if sent_epoch < state.epoch:
        return state
    limit = state.limit * ERROR_CUT
    slots = state.slots
    if base is not None and waited_s > 0:
        slots = load * base / waited_s
        limit = min(limit, slots * HEADROOM)
    limit = state.bounded(limit)
    return replace(state, limit=limit, ssthresh=limit, epoch=state.epoch + 1, queues=True, slots=slots)


def rate_floor(rpm: float, latency_s: float) -> float:
    """The limit a declared rate of ``rpm`` needs at answers of ``latency_s``."""
    return rpm / 60.0 * latency_s * RATE_FLOOR_FACTOR


def at_least(state: LimitState, floor: float) -> LimitState:
    """The limit raised to ``floor`` (within its cap); never lowered."""
    if floor <= state.limit:
        return state
    return replace(state, limit=state.bounded(floor))


def growth_pace(state: LimitState, in_flight: int, proven: float, share: int, latency_s: float) -> float | None:
    """Calls per second a process may send an endpoint beyond ``proven`` in flight (the
    most it has answered at once, at least its part of the initial limit), in slow
    start (None: no pace). Slow start quadruples the limit per round, and
    the new room taken at once hit an unstated quota with a burst it refused whole (14%
    of a first step's calls were 429s): the calls beyond go out spread over
    :data:`SLOW_START_SPREAD` of a round, at ``share / (spread x latency)``, so that the
    first 429 stops them early."""
    if not state.slow_start or in_flight <= proven:
        return None
    return share / max(SLOW_START_SPREAD * latency_s, 1e-3)


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


#: What an answer's verdict asks of the limit.
GROW, HOLD, QUEUE, REBASE = "grow", "hold", "queue", "rebase"


def respond(
    state: LimitState,
    verdict: Verdict | None,
    *,
    late_one: bool = False,
    after_queue_cut: bool = False,
    drained: bool = True,
) -> str:
    """The rule. Late (the recent median over :data:`INFLATION` of the base) is a
    queue, unless the calls were sent within a limit just set by a queue cut
    (``after_queue_cut``) and the calls sent before it are answered (``drained``): then
    the server itself slowed, and the base is learnt again. In slow start an answer
    late on its own (``late_one``) does not grow the limit: slow start quadruples per
    round, and waiting for the median let it send a 32-slot server ten times its
    slots. Else it grows: past slow start by a few calls a round, up to the next late
    verdict (holding below it instead left a server whose base was read low, from the
    quickest answers of a noisy first wave, at half its slots)."""
    if verdict is not None and verdict.ratio > INFLATION:
        return REBASE if after_queue_cut and drained and verdict.load <= state.limit else QUEUE
    if state.slow_start and late_one:
        return HOLD
    return GROW


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
