"""The HTTP client of one endpoint: a connect timeout of its own, connections paced.

A server accepts new connections at its own pace: its accept queue (the listen
backlog, 5 in the smallest servers) holds what it has not accepted yet, and the kernel
drops connection attempts beyond it; the client's retransmissions then come 1, 3, 7,
15 s later. A step's first wave opening hundreds of connections at once lost them that
way, and a server without keep-alive needs a new connection for every call. Nothing
tells a client the queue is filling (a connection is accepted in microseconds until
the queue overflows), so each endpoint's connections are opened at a paced rate
(:class:`ConnectPacer`): it doubles with each second of connections accepted at once
until one is not, then drops by :data:`PACE_CUT` and grows by a tenth a second
(:data:`PACE_PROBE`). An attempt the server has not answered within a few times the
usual connect time is made again at once, not after the kernel's one-second
retransmission. Keep-alive connections are reused as before, so a server that keeps
connections open pays the pace only for its first ones.

Only the server's silence may cut the pace. Time spent waiting for a turn is the
client's own queue: it does not count against the connect timeout (counting it made
attempts given a millisecond fail, each failure cutting the pace further, until a
step crawled at the floor for a minute). An attempt whose timer fired late found the
client's event loop busy, not the server silent: it is made again without a cut. And
attempts made before a cut are one congestion event: they cannot cut again.

The transport is the official ``openai`` client's aiohttp one, given an aiohttp session
whose connector does the pacing (``_create_connection`` is aiohttp's hook for making a
new connection, overridden here and covered by a test).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import aiohttp
import attr
import httpx2
import openai
from openai._vendor.httpx_aiohttp import AiohttpTransport

#: New connections per second at first, at least and at most.
PACE_INITIAL = 500.0
PACE_MIN = 10.0
PACE_MAX = 100_000.0
#: After an attempt the server did not answer: the pace is cut by this factor (once per
#: congestion event: only an attempt started after the last cut cuts again) and then
#: grows by :data:`PACE_PROBE` of itself per second of connections made at that pace.
PACE_CUT = 0.85
PACE_PROBE = 0.1
#: An attempt is made again after this many times the usual connect time, within
#: these bounds (the upper one is the kernel's own first retransmission).
TRY_FACTOR = 4.0
TRY_MIN_S = 0.25
TRY_MAX_S = 1.0
#: A timed-out attempt noticed later than this part of its timeout (at least
#: :data:`LATE_MIN_S`) after its timer was due says the event loop was busy: the
#: server's answer may have come and waited unread, so it says nothing of the server.
LATE_SHARE = 0.5
LATE_MIN_S = 0.05
#: The wall time all attempts of one connection may take, in connect timeouts (late
#: attempts do not spend the timeout itself, but a loop busy for ever must not retry
#: for ever).
INCONCLUSIVE_ALLOWANCE = 3.0


#: The seconds the running call spent waiting for connection turns (see :func:`turn_waits`).
_TURN_WAITS: ContextVar[list[float] | None] = ContextVar("drcredit_connect_turn_waits", default=None)


@contextmanager
def turn_waits() -> Iterator[list[float]]:
    """Gather the time the calls made in the block waited for their connection turns.

    That wait is the client's own queue, not the server's: a call's latency less it is
    what the server took (a step's first wave opening a thousand connections waited
    up to two seconds for turns, and that read as a server slowing down).
    """
    waited = [0.0]
    token = _TURN_WAITS.set(waited)
    try:
        yield waited
    finally:
        _TURN_WAITS.reset(token)


class ConnectPacer:
    """The pace of new connections to one endpoint (engine loop only)."""

    def __init__(self, rate: float = PACE_INITIAL, clock: Any = time.monotonic):
        self.rate = rate
        self._clock = clock
        self._due = 0.0
        #: When the pace was last cut (attempts started before then cannot cut it again).
        self._cut_at = -math.inf
        #: Until the first unanswered attempt the pace doubles per second (slow start).
        self.probing = False
        #: Connection attempts made, those the server left unanswered, and those timed
        #: out while the event loop was too busy to tell.
        self.attempts = 0
        self.unanswered = 0
        self.inconclusive = 0
        #: Smoothed seconds of an answered connection attempt.
        self.connect_s: float | None = None

    def now(self) -> float:
        return float(self._clock())

    async def turn(self) -> None:
        """Wait for this connection attempt's turn."""
        now = self._clock()
        start = max(now, self._due)
        self._due = start + 1.0 / self.rate
        if start > now:
            await asyncio.sleep(start - now)

    def try_timeout_s(self) -> float:
        """How long one attempt may wait for the server before it is made again."""
        if self.connect_s is None:
            return TRY_MAX_S
        return min(TRY_MAX_S, max(TRY_MIN_S, TRY_FACTOR * self.connect_s))

    def answered(self, seconds: float) -> None:
        self.attempts += 1
        self.connect_s = seconds if self.connect_s is None else self.connect_s + 0.1 * (seconds - self.connect_s)
        gain = PACE_PROBE if self.probing else 1.0
        self.rate = min(PACE_MAX, self.rate + gain)

    def timed_out(self, started_at: float, timeout_s: float, waited_s: float) -> bool:
        """An attempt started at ``started_at`` (this pacer's clock) with ``timeout_s``
        gave up after ``waited_s``; True when it counts as unanswered by the server."""
        self.attempts += 1
        if waited_s - timeout_s > max(LATE_MIN_S, LATE_SHARE * timeout_s):
            self.inconclusive += 1
            return False
        self.unanswered += 1
        if started_at > self._cut_at:
            self._cut_at = self._clock()
            self.rate = max(PACE_MIN, self.rate * PACE_CUT)
            self.probing = True
        return True


class PacedConnector(aiohttp.TCPConnector):
    """aiohttp's connector, opening new connections at a :class:`ConnectPacer`'s pace."""

    def __init__(self, pacer: ConnectPacer, **kwargs: Any):
        super().__init__(**kwargs)
        self.pacer = pacer

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        # The connect timeout is the time the server was given to answer, summed over
        # attempts; waiting for a turn is not part of it. Attempts a busy loop could not
        # judge spend only the looser allowance.
        budget = timeout.sock_connect or TRY_MAX_S
        allowance = INCONCLUSIVE_ALLOWANCE * budget
        while True:
            queued = self.pacer.now()
            await self.pacer.turn()
            started = self.pacer.now()
            waits = _TURN_WAITS.get()
            if waits is not None:
                waits[0] += started - queued
            given = max(0.001, min(self.pacer.try_timeout_s(), budget))
            try:
                proto = await super()._create_connection(req, traces, attr.evolve(timeout, sock_connect=given))
            except TimeoutError:  # aiohttp's sock_connect timeout (a plain TimeoutError)
                waited = self.pacer.now() - started
                allowance -= waited
                if self.pacer.timed_out(started, given, waited):
                    budget -= given
                if budget <= 0.0 or allowance <= 0.0:
                    raise
                continue  # a fresh attempt now, not the kernel's retransmission a second later
            self.pacer.answered(self.pacer.now() - started)
            return proto


def http_client(pacer: ConnectPacer, *, answer_timeout_s: float, connect_timeout_s: float, keepalive_s: float) -> Any:
    """An ``httpx2`` client on the aiohttp transport, for one endpoint and one event loop.

    Connections are limited only by the platform's own call limits (aiohttp's default
    of 100 capped a worker at 100 calls in flight), idle ones expire after
    ``keepalive_s``, and a connection attempt gives up after ``connect_timeout_s``,
    apart from the time an answer may take.
    """

    def session() -> aiohttp.ClientSession:
        connector = PacedConnector(pacer, limit=0, keepalive_timeout=keepalive_s)
        return aiohttp.ClientSession(connector=connector)

    return openai.DefaultAioHttpClient(
        timeout=httpx2.Timeout(answer_timeout_s, connect=connect_timeout_s),
        transport=AiohttpTransport(client=session),
    )
