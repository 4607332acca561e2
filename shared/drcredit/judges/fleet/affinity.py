"""Calls that share a prompt prefix go to the same replica, and to the same llama.cpp slot.

A judge server's prefix cache only helps a call that lands where its prefix is cached: a
visit's rubric calls share the question, the reasoning, the call and the pages
(:mod:`drcredit.judges.prompts`, ``shared-first-v1``), and sent to two replicas each
prefills them once. Each call carries an affinity key, the digest of its shared prefix
(:data:`CALL_AFFINITY`, set by the judge for the call); the router asks :func:`steer`
which endpoint takes it.

A key's first call goes to the replica with the fewest calls in flight per unit of weight
among those that qualify, and the key is pinned there (:class:`Pins`); its later calls
follow the pin. A replica qualifies when it has room, is no slower than the router's own
choice (its latency within :data:`LOAD_BOUND` of that one's) and is not above
:data:`LOAD_BOUND` x its weighted share of the calls in flight; the router's choice
always qualifies, and before a replica has answered only that choice does. Among equally
loaded replicas the key's rendezvous order (highest random weight) decides, so processes
at the same loads agree. A pinned replica that is only full (no slower than the router's
choice, within its bound) makes the call wait for one of its places: its next answer
frees one within moments, while another replica would prefill the whole shared prefix
again. A pinned replica over its bound or slower gives that one call to the router's
choice and keeps the key, as does one a call is retried away from; one out of the
rotation (or cooling off a rate limit) loses its keys, which are pinned again.

Pinning by load, not by hash alone, is measured (BENCHMARKS.md, round 24): a consistent
hash spreads keys evenly but not their work, and with two replicas whose prefill queues
serve one request at a time, the replica a hash had given more pages kept a longer
queue while the other stood idle (fifteen steps each: median 17.9 s by hash, 17.0 s by
load, a tenth less prefilled). A new visit is free to go anywhere (its pages are cached
nowhere yet), so it goes where the fewest calls wait.

A llama.cpp server keeps one prompt cache per slot: where its slots are known, the call
names the slot its key hashes to (``id_slot``, with ``cache_prompt``), so calls sharing a
prefix meet the slot that holds it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from contextvars import ContextVar

from drcredit.judges.fleet.state import Endpoint
from drcredit.recent import Recent

#: The affinity key of the call being placed (None: no preference).
CALL_AFFINITY: ContextVar[str | None] = ContextVar("drcredit_call_affinity", default=None)

#: How far above its share of the calls in flight, and how much slower than the router's
#: choice, a preferred endpoint may be.
LOAD_BOUND = 1.25

#: Affinity keys a process remembers the replica of (a step's visits are a few thousand).
PIN_MEMORY = 16_384


def affinity_key(shared_prefix: str) -> str:
    return hashlib.blake2b(shared_prefix.encode(), digest_size=8).hexdigest()


def _weight(key: str, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}|{url}".encode(), digest_size=8).digest(), "big")


def rendezvous(key: str, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
    """``endpoints`` in the key's order of preference."""
    return sorted(endpoints, key=lambda e: _weight(key, e.url), reverse=True)


def steer(
    key: str | None,
    scored: Sequence[tuple[Endpoint, float]],
    chosen: Endpoint | None,
    pins: Pins | None = None,
    excluded: frozenset[str] = frozenset(),
) -> Endpoint | None:
    """The endpoint a call with affinity ``key`` should take, among ``scored`` (each
    candidate with its pace: its latency per unit of weight, infinite before its first
    answer); ``chosen``: the router's own choice, kept when nothing else qualifies or
    there is nothing to choose between; ``pins``: where this process sent each key;
    ``excluded``: endpoints this call failed on (its retry goes elsewhere, the key stays).
    None: the call waits for its pinned replica, which is full."""
    if key is None or chosen is None or len(scored) < 2:
        return chosen
    pins = pins if pins is not None else Pins()
    pace = dict((e.url, p) for e, p in scored)
    in_flight = sum(e.in_flight for e, _ in scored) + 1
    weights = sum(e.config.weight for e, _ in scored)

    def fits(e: Endpoint) -> bool:
        """Within its load bound and no slower than the router's choice (room aside)."""
        if e is chosen:
            return True
        fair = LOAD_BOUND * in_flight * e.config.weight / weights
        known = math.isfinite(pace[e.url])  # before its first answer: only the router's choice
        return (
            known
            and e.in_flight + 1 <= max(1.0, fair)
            and (not math.isfinite(pace[chosen.url]) or pace[e.url] <= LOAD_BOUND * pace[chosen.url])
        )

    def qualifies(e: Endpoint) -> bool:
        return e is chosen or (e.in_flight < e.share and not e.prefill.full() and fits(e))

    pinned = pins.get(key)
    if pinned is not None:
        for e, _ in scored:
            if e.url == pinned:
                if qualifies(e):
                    return e
                # Only full: wait for its next place rather than prefill the prefix twice.
                return None if fits(e) else chosen
    candidates = rendezvous(key, [e for e, _ in scored if qualifies(e)])
    best = min(candidates, key=lambda e: e.in_flight / e.config.weight)  # ties: the key's order
    if pinned not in excluded:
        pins.pin(key, best.url)
    return best


class Pins:
    """Where this process sent each affinity key's first call (the most recent
    :data:`PIN_MEMORY` keys: a key matters while its visit's calls are going out)."""

    def __init__(self, capacity: int | None = None) -> None:
        self._urls: Recent[str, str] = Recent(size=capacity or PIN_MEMORY)

    def get(self, key: str) -> str | None:
        return self._urls.get(key)

    def pin(self, key: str, url: str) -> None:
        self._urls.put(key, url)

    def __len__(self) -> int:
        return len(self._urls)


class Affinities:
    """The affinity keys of the calls waiting in a router, by their rank (unique per call)."""

    def __init__(self) -> None:
        self._keys: dict[tuple[int, int], str] = {}

    def remember(self, rank: tuple[int, int], key: str | None) -> None:
        if key is not None:
            self._keys[rank] = key

    def forget(self, rank: tuple[int, int]) -> str | None:
        return self._keys.pop(rank, None)

    def of(self, rank: tuple[int, int]) -> str | None:
        return self._keys.get(rank)


def slot_of(key: str | None, slots: int | None) -> int | None:
    """The llama.cpp slot a key's calls go to (None: slots unknown, or only one)."""
    if key is None or not slots or slots < 2:
        return None
    return _weight(key, "slot") % slots
