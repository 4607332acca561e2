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
its own (:meth:`~drcredit.judges.fleet.latency.LatencyWatch.hold`): a queue growing a
few calls a round would otherwise carry it up with the latency, and no answer would
ever read as late. A call that times out while the endpoint answers others is a queue
too: the slots are fewer than ``load x base / timeout`` (:func:`timed_out`). A late
verdict right after a queue cut, from calls sent within the new limit, says the server
itself slowed (other clients, longer prompts): the base is learnt again instead of
cutting twice.

Growth and the latency verdicts need the endpoint busy (half a process's share in
flight): only then is the limit what the answers' pace says something about. A cut
applies once per round: answers to calls sent before the last cut say nothing about the
new limit (the ``epoch``).

The state is a plain value, fleet-wide per endpoint (shared between processes through
:mod:`drcredit.judges.fleet.store`); this module only computes the next one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from drcredit.judges.fleet.latency import Verdict

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
#: The limit set on a late verdict: the estimated slots and this much more, so that a
#: slot freed is taken at once (each answer's round trip) and the estimate's noise
#: (a lognormal server's median) does not leave slots idle.
HEADROOM = 1.25


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
