"""Calls sharing a prompt prefix go to one replica: the least loaded when its first call
goes out, pinned there, within bounds, the key's hash breaking ties
(drcredit.judges.fleet.affinity), each rule checked on endpoints built here."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from typing import Any

from drcredit.judges.fleet.affinity import CALL_AFFINITY, LOAD_BOUND, Pins, rendezvous, slot_of, steer
from drcredit.judges.fleet.endpoints import EndpointConfig
from drcredit.judges.fleet.router import Fleet
from drcredit.judges.fleet.state import Endpoint

URLS = [f"http://judge-{k}:8000/v1" for k in range(3)]


def endpoints(n: int = 3, share: int = 100) -> list[Endpoint]:
    out = [Endpoint(EndpointConfig(u)) for u in URLS[:n]]
    for e in out:
        e.fraction = share / e.limit  # a share of `share` calls in flight
    return out


def test_a_key_always_goes_to_the_same_replica_and_keys_spread_evenly() -> None:
    es = endpoints()
    scored = [(e, 1.0) for e in es]
    picks = Counter(steer(f"visit-{k}", scored, es[0]).url for k in range(3000))  # type: ignore[union-attr]
    assert all(steer("visit-7", scored, es[0]) is steer("visit-7", scored, es[2]) for _ in range(5))
    # 3,000 keys over 3 equal replicas: each within 10% of 1,000.
    assert set(picks) == set(URLS) and all(900 <= n <= 1100 for n in picks.values())


def test_a_replica_leaving_moves_only_its_own_keys() -> None:
    es = endpoints()
    before = {k: rendezvous(f"k{k}", es)[0].url for k in range(600)}
    after = {k: rendezvous(f"k{k}", es[:2])[0].url for k in range(600)}
    moved = {k for k in before if before[k] != after[k]}
    assert moved == {k for k in before if before[k] == URLS[2]}


def test_no_replica_takes_more_than_its_bounded_share_of_the_calls_in_flight() -> None:
    es = endpoints(2)
    key = next(f"k{k}" for k in range(100) if rendezvous(f"k{k}", es)[0] is es[0])
    # 10 calls in flight, all on the key's replica: with this call 11, its share is 5.5,
    # bounded at 1.25 x 5.5 = 6.875 calls: a call more would be 11 > 6.875, so the other takes it.
    es[0].in_flight = 10
    assert steer(key, [(e, 1.0) for e in es], es[1]) is es[1]
    # 5 there and 1 on the other: 7 with this call, 1.25 x 3.5 = 4.375 < 6: still the other.
    es[0].in_flight, es[1].in_flight = 5, 1
    assert steer(key, [(e, 1.0) for e in es], es[1]) is es[1]
    # 2 there and 2 on the other: 5 with it, 1.25 x 2.5 = 3.125 >= 3: the key's replica.
    es[0].in_flight, es[1].in_flight = 2, 2
    assert steer(key, [(e, 1.0) for e in es], es[1]) is es[0]
    assert LOAD_BOUND == 1.25


def test_a_replica_answering_much_later_than_the_best_is_not_preferred() -> None:
    es = endpoints(2)
    key = next(f"k{k}" for k in range(100) if rendezvous(f"k{k}", es)[0] is es[0])
    assert steer(key, [(es[0], 1.3), (es[1], 1.0)], es[1]) is es[1]  # 1.3 > 1.25 x 1.0
    assert steer(key, [(es[0], 1.2), (es[1], 1.0)], es[1]) is es[0]
    full = endpoints(2, share=1)
    full[0].in_flight = 1
    assert steer(key, [(e, 1.0) for e in full], full[1]) is full[1]  # no room on it
    assert steer(None, [(e, 1.0) for e in es], es[1]) is es[1]  # no key: the router's choice
    unknown = [(es[0], math.inf), (es[1], 1.0)]
    assert steer(key, unknown, es[1]) is es[1]  # a replica that has not answered yet is not preferred


def test_the_fleet_places_calls_of_one_prefix_on_one_replica() -> None:
    async def run() -> Counter[str]:
        fleet = Fleet([EndpointConfig(u) for u in URLS[:2]])
        for e in fleet.endpoints:
            e.latency.observe(0.5)  # both have answered, alike: steering only starts then
        placed: Counter[str] = Counter()
        try:
            for k in range(40):
                CALL_AFFINITY.set("visit-a" if k % 2 else "visit-b")
                lease = await fleet.acquire()
                placed[f"{CALL_AFFINITY.get()}@{lease.endpoint.url}"] += 1
                fleet.release(lease)
        finally:
            await fleet.aclose()
        return placed

    placed = asyncio.run(run())
    assert sorted(placed.values()) == [20, 20]  # each prefix on one replica only
    assert len({k.split("@")[1] for k in placed}) == 2  # and the two prefixes on different ones here


def test_a_new_key_goes_to_the_least_loaded_replica_and_stays_there() -> None:
    es = endpoints(2)
    key = next(f"k{k}" for k in range(100) if rendezvous(f"k{k}", es)[0] is es[0])
    pins = Pins()
    # Its hash prefers es[0], but es[0] has 4 calls in flight and es[1] has 3: fewer
    # calls wait on es[1] (both within 1.25 x their share of the 8 with this call: 5).
    es[0].in_flight, es[1].in_flight = 4, 3
    assert steer(key, [(e, 1.0) for e in es], es[0], pins) is es[1]
    # Its later calls follow it there though es[1] is now the busier (5 there, 4 here:
    # 10 with this call, 1.25 x 5 = 6.25 >= 6), whichever the router would choose.
    es[0].in_flight, es[1].in_flight = 4, 5
    assert steer(key, [(e, 1.0) for e in es], es[0], pins) is es[1]
    assert pins.get(key) == es[1].url
    # At equal loads the key's own order decides, so processes at the same loads agree.
    es[0].in_flight = es[1].in_flight = 2
    assert steer(key, [(e, 1.0) for e in es], es[1], Pins()) is es[0]


def test_a_pinned_replica_over_its_bound_lends_one_call_and_keeps_the_key() -> None:
    es = endpoints(2)
    pins = Pins()
    pins.pin("visit", es[0].url)
    # 7 on it, 1 on the other: 9 with this call, bounded at 1.25 x 4.5 = 5.625 < 8.
    es[0].in_flight, es[1].in_flight = 7, 1
    assert steer("visit", [(e, 1.0) for e in es], es[1], pins) is es[1]
    assert pins.get("visit") == es[0].url  # the key stays: its pages are cached there
    es[0].in_flight, es[1].in_flight = 3, 3
    assert steer("visit", [(e, 1.0) for e in es], es[1], pins) is es[0]


def test_a_full_pinned_replica_makes_the_call_wait_unless_it_is_slower_or_over_its_bound() -> None:
    es = endpoints(2, share=4)
    pins = Pins()
    pins.pin("visit", es[0].url)
    # Full (4 of 4) but within its bound (4 + 1 <= 1.25 x 8 / 2 = 5) and as fast: wait
    # for its next place (None) rather than prefill the visit's pages on es[1] too.
    es[0].in_flight, es[1].in_flight = 4, 3
    assert steer("visit", [(e, 1.0) for e in es], es[1], pins) is None
    # Slower than the router's choice (1.3 > 1.25 x 1.0): es[1] takes the call.
    assert steer("visit", [(es[0], 1.3), (es[1], 1.0)], es[1], pins) is es[1]
    # Over its bound (4 + 1 > 1.25 x 5 / 2): es[1] takes the call.
    es[1].in_flight = 0
    assert steer("visit", [(e, 1.0) for e in es], es[1], pins) is es[1]
    assert pins.get("visit") == es[0].url  # the key stays in every case


def test_a_call_pinned_to_a_full_replica_waits_for_its_next_place() -> None:
    """Twenty calls on one replica (its limit) and nineteen on the other, a visit pinned
    to the first: two more calls of the visit, the second less urgent, wait for the first
    replica, though the other has room (they are not lent to it, which would prefill the
    visit's pages there too), and take its places as its calls end."""
    from drcredit.judges.fleet.state import CALL_PRIORITY

    async def run() -> tuple[list[str], list[str], int, str]:
        fleet = Fleet([EndpointConfig(u, max_concurrency=20) for u in URLS[:2]])
        for e in fleet.endpoints:
            e.latency.observe(0.5)
        try:
            CALL_AFFINITY.set(None)
            held: list[Any] = [await fleet.acquire() for _ in range(39)]
            a, b = sorted(fleet.endpoints, key=lambda e: -e.in_flight)
            assert (a.in_flight, b.in_flight) == (20, 19)
            fleet.pins.pin("visit-a", a.url)
            CALL_AFFINITY.set("visit-a")
            CALL_PRIORITY.set(5)
            urgent = asyncio.ensure_future(fleet.acquire())
            CALL_PRIORITY.set(1)
            later = asyncio.ensure_future(fleet.acquire())
            await asyncio.sleep(0.05)
            waited = [f.done() for f in (urgent, later)]
            on_b_meanwhile = b.in_flight
            for lease in [x for x in held if x.endpoint is a][:2]:
                fleet.release(lease)
            placed = [(await asyncio.wait_for(f, 1)).endpoint.url for f in (urgent, later)]
            return [str(w) for w in waited], placed, on_b_meanwhile, a.url
        finally:
            await fleet.aclose()

    waited, placed, on_b, a_url = asyncio.run(run())
    assert waited == ["False", "False"]  # both waited
    assert on_b == 19  # nothing was lent to the other replica
    assert placed == [a_url, a_url]


def test_a_key_whose_replica_left_the_rotation_is_pinned_again() -> None:
    es = endpoints(3)
    pins = Pins()
    pins.pin("visit", es[2].url)
    es[0].in_flight, es[1].in_flight = 3, 1
    # es[2] is not among the candidates (out of the rotation): the least loaded takes it.
    assert steer("visit", [(es[0], 1.0), (es[1], 1.0)], es[0], pins) is es[1]
    assert pins.get("visit") == es[1].url


def test_a_retry_away_from_the_pinned_replica_keeps_the_key() -> None:
    es = endpoints(3)
    pins = Pins()
    pins.pin("visit", es[0].url)
    # The call failed on es[0]: its retry goes to es[1] or es[2]; the visit's other calls
    # still find their pages on es[0].
    assert steer("visit", [(es[1], 1.0), (es[2], 1.0)], es[1], pins, frozenset({es[0].url})) is es[1]
    assert pins.get("visit") == es[0].url


def test_before_a_replica_has_answered_a_new_key_takes_the_routers_choice() -> None:
    es = endpoints(2)
    pins = Pins()
    es[0].in_flight = 5
    # es[1] is idle but has never answered: its pace is unknown, so it is not preferred.
    assert steer("visit", [(es[0], 1.0), (es[1], math.inf)], es[0], pins) is es[0]
    assert pins.get("visit") == es[0].url


def test_pins_remember_the_most_recent_keys_only() -> None:
    pins = Pins(capacity=3)
    for k in range(4):
        pins.pin(f"k{k}", f"url{k}")
    assert len(pins) == 3 and pins.get("k0") is None
    assert pins.get("k1") == "url1"  # read: now the most recent
    pins.pin("k4", "url4")
    assert pins.get("k2") is None and pins.get("k1") == "url1"


def test_llama_slots_by_key_only_where_the_server_has_several() -> None:
    assert slot_of("k", None) is None and slot_of("k", 1) is None and slot_of(None, 4) is None
    slots = Counter(slot_of(f"k{k}", 2) for k in range(1000))
    assert set(slots) == {0, 1} and all(400 <= n <= 600 for n in slots.values())
    assert slot_of("visit-9", 4) == slot_of("visit-9", 4)
