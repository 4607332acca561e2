"""Calls that share a prompt prefix go to the same replica, and to the same llama.cpp slot.

A judge server's prefix cache only helps a call that lands where its prefix is cached: a
visit's rubric calls share the question, the reasoning, the call and the pages
(:mod:`drcredit.judges.prompts`, ``shared-first-v1``), and sent to two replicas each
prefills them once. Each call carries an affinity key, the digest of its shared prefix
(:data:`CALL_AFFINITY`, set by the judge for the call); the router asks :func:`steer`
which endpoint takes it. That is a consistent hash with bounded load: the endpoints in
the key's rendezvous order (highest random weight: an endpoint leaving moves only its
own keys), the first that has room, is no slower than the router's own choice (its
latency within :data:`LOAD_BOUND` of that one's) and is not above :data:`LOAD_BOUND` x its
weighted share of the calls in flight. When none qualifies the router's choice stands,
so failover, the learned limits and a slow replica's smaller share are as without
affinity.

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

#: The affinity key of the call being placed (None: no preference).
CALL_AFFINITY: ContextVar[str | None] = ContextVar("drcredit_call_affinity", default=None)

#: How far above its share of the calls in flight, and how much slower than the router's
#: choice, a preferred endpoint may be.
LOAD_BOUND = 1.25


def affinity_key(shared_prefix: str) -> str:
    return hashlib.blake2b(shared_prefix.encode(), digest_size=8).hexdigest()


def _weight(key: str, url: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}|{url}".encode(), digest_size=8).digest(), "big")


def rendezvous(key: str, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
    """``endpoints`` in the key's order of preference."""
    return sorted(endpoints, key=lambda e: _weight(key, e.url), reverse=True)


def steer(key: str | None, scored: Sequence[tuple[Endpoint, float]], chosen: Endpoint | None) -> Endpoint | None:
    """The endpoint a call with affinity ``key`` should take, among ``scored`` (each
    candidate with its pace: its latency per unit of weight, infinite before its first
    answer); ``chosen``: the router's own choice, kept when no endpoint of the key
    qualifies or there is nothing to choose between."""
    if key is None or chosen is None or len(scored) < 2:
        return chosen
    pace = dict((e.url, p) for e, p in scored)
    in_flight = sum(e.in_flight for e, _ in scored) + 1
    weights = sum(e.config.weight for e, _ in scored)
    for e in rendezvous(key, [e for e, _ in scored]):
        if e is chosen:
            return e
        fair = LOAD_BOUND * in_flight * e.config.weight / weights
        known = math.isfinite(pace[e.url]) and math.isfinite(pace[chosen.url])  # before an answer: no steering
        if (
            known
            and e.in_flight < e.share
            and e.in_flight + 1 <= max(1.0, fair)
            and pace[e.url] <= LOAD_BOUND * pace[chosen.url]
        ):
            return e
    return chosen


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
