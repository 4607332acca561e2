"""How many calls one process lets wait for an endpoint's prefill (streamed answers).

A judge server prefills the prompts it is sent in the order they came (vLLM, SGLang and
llama.cpp do by default), so a call sent behind a hundred others waits for all of their
prefills, whatever its chain. A chain's next call is ready only once its previous one is
answered, and the step's longest chains, which decide when it ends, meet that queue
once per call. The platform knows which call should go first (the one whose chain has
the most calls left, :mod:`drcredit.scoring.priority`) but can act on it only while the
call is still here. So each process keeps only a few calls waiting for an endpoint's
prefill, and the rest in its own queue, in priority order (BENCHMARKS.md, round 30).

A streamed answer's first event marks the end of the call's prefill: a server sends it
with the first token. For a call whose prompt head the endpoint already holds (a
visit's later rubric calls, whose own prefill is short), the time to that event less a
low quantile of such times of late (the *floor*, what the server takes when nothing
queues: its network and its scheduling, long on a hosted API) is the time the call
queued; the median of the last :data:`RECENT` such calls is what the depth answers to.
They queued too long when they queued more than :data:`TARGET_SHARE` of the
endpoint's answer latency and more than the floor itself (a hosted API's first tokens
vary by more than a twentieth of its latency with no queue of ours behind them; the
same rule as the concurrency limit's answers past twice the base). The depth starts at
:data:`STARTING_DEPTH` and, while the depth is in use, each such call after which they
did not queue too long grows it (by one until the first cut, a slow start doubling per round;
then by one per round); one after which they did cuts it by :data:`CUT`, once per round
(only a call sent after the last cut can cut again). It never goes below
:data:`MIN_DEPTH`: one call prefilled while the next waits keeps the server busy across
the platform's own reaction time. An endpoint that answers in one body, or buffers its
stream (the first event comes with the last), is never held to a depth. Per process and
endpoint; only touched from the engine loop.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from drcredit.recent import Recent

#: The depth before anything is known, per process.
STARTING_DEPTH = 8
#: The least depth, per process.
MIN_DEPTH = 2
#: A call may queue for the prefill this share of the endpoint's answer latency before
#: the depth is cut: a chain waits that long per call, so it bounds what the queue adds
#: to the step.
TARGET_SHARE = 0.05
#: What a cut leaves of the depth.
CUT = 0.75
#: The floor is this low quantile of the last :data:`FLOOR_MEMORY` such times (the
#: very least would be one lucky call's).
FLOOR_QUANTILE = 0.1
FLOOR_MEMORY = 256
#: Followers whose queueing is judged together (their median): one late first token is
#: the server's noise, most of them late a queue.
RECENT = 16
#: Prompt heads remembered per endpoint (a step's visits are a few thousand).
HEADS = 16_384
#: A stream whose first event comes after this share of the call's time is buffered.
BUFFERED_SHARE = 0.9
#: Weight of each answer in the share of answers that streamed.
STREAM_WEIGHT = 0.2


class PrefillQueue:
    """One endpoint's calls waiting for their prefill in this process, and their bound."""

    def __init__(self) -> None:
        self.depth = float(STARTING_DEPTH)
        #: Calls sent whose first event has not come (queued for or in the prefill).
        self.waiting = 0
        #: The share of recent answers that streamed (None: no answer yet).
        self.streamed: float | None = None
        #: Whether an event came before any answer did (a stream, it seems).
        self.first_seen = False
        self._floor: deque[float] = deque(maxlen=FLOOR_MEMORY)
        self._recent: deque[float] = deque(maxlen=RECENT)
        #: The prompt heads (affinity keys) sent here: a later call with one follows.
        self._heads: Recent[str, bool] = Recent(size=HEADS)
        #: The depth was reached since the last change (a grown depth is used first).
        self._used = False
        self._cut_at = -math.inf

    @property
    def gates(self) -> bool:
        """Whether the endpoint streams (answers' first events say when prefills end)."""
        if self.streamed is None:
            return self.first_seen
        return self.streamed >= 0.5

    def full(self) -> bool:
        """Whether another call sent now would queue past the depth."""
        if not self.gates or self.waiting < math.floor(self.depth):
            return False
        self._used = True
        return True

    def sent(self, key: str | None = None) -> bool:
        """A call goes out with prompt head ``key``; whether one with it went before
        (the endpoint holds that head: the call follows it)."""
        self.waiting += 1
        if key is None:
            return False
        follows = self._heads.get(key) is not None
        self._heads.put(key, True)
        return follows

    def gone(self) -> None:
        """A call that waited is answered or given up without a first event."""
        self.waiting -= 1

    def first_event(self, seconds: float, follows: bool, sent_at: float, now: float, latency_s: float | None) -> None:
        """A call's first event came ``seconds`` after it was sent (at ``sent_at``);
        ``follows``: the endpoint held its prompt head; ``latency_s``: the endpoint's
        usual answer latency (None: not known yet)."""
        self.waiting -= 1
        self.first_seen = True
        if not follows:
            return
        self._floor.append(seconds)
        if latency_s is None:
            return
        floor = sorted(self._floor)[int(FLOOR_QUANTILE * (len(self._floor) - 1))]
        self._recent.append(seconds)
        queued = statistics.median(self._recent) - floor
        if queued > max(TARGET_SHARE * latency_s, floor):
            if sent_at > self._cut_at:
                self.depth = max(float(MIN_DEPTH), self.depth * CUT)
                self._cut_at = now
                self._used = False
        elif self._used:
            # Before the first cut, one more per call (a slow start, doubling per round);
            # after it, one more per round.
            self.depth += 1.0 if self._cut_at == -math.inf else 1.0 / self.depth
            self._used = False

    def answered(self, first_s: float | None, total_s: float) -> None:
        """An answer came in ``total_s``, its first event after ``first_s`` (None: it
        was not streamed)."""
        streamed = first_s is not None and (total_s <= 0 or first_s < BUFFERED_SHARE * total_s)
        value = 1.0 if streamed else 0.0
        self.streamed = value if self.streamed is None else self.streamed + STREAM_WEIGHT * (value - self.streamed)
