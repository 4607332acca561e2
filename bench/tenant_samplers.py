"""What the tenants benchmark (:mod:`bench.tenants`) reads while a phase runs: each
tenant's demand from the fleet's reports in Redis, the calls the judge holds, and the
judgments each tenant got per window of time."""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from typing import Any, Generic, Self, TypeVar

import httpx
import orjson
import psycopg
import redis

from bench.conditions import stats

#: The window the served shares are counted in, in seconds.
WINDOW_S = 10.0


T = TypeVar("T")


class Sampler(Generic[T]):
    """Reads something every ``period_s`` in a thread of its own while a phase runs."""

    period_s = 1.0

    def __init__(self) -> None:
        self.samples: list[T] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def read(self) -> T:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            with contextlib.suppress(httpx.HTTPError):
                self.samples.append(self.read())

    def stop(self) -> list[T]:
        self._stop.set()
        self._thread.join()
        return self.samples


class DemandSampler(Sampler[tuple[float, dict[str, int]]]):
    """Each tenant's demand across the deployment (calls waiting or in flight), read from
    the processes' reports in the fleet's Redis every half second, with the time."""

    period_s = 0.5

    def __init__(self, broker: str):
        super().__init__()
        self.client = redis.Redis.from_url(broker)

    def read(self) -> tuple[float, dict[str, int]]:
        demand: dict[str, int] = {}
        for key in self.client.scan_iter("drcredit:judge:processes:*"):
            for raw in self.client.hgetall(key).values():
                for tenant, n in orjson.loads(raw).get("tenants", {}).items():
                    demand[tenant] = demand.get(tenant, 0) + int(n)
        return time.time(), demand

    def finish(self) -> list[tuple[float, dict[str, int]]]:
        return self.stop()


def backlogged(samples: list[tuple[float, dict[str, int]]], parts: dict[str, float], start: float, end: float) -> bool:
    """Every tenant wanted at least its part of the slots at every sample in [start, end)."""
    inside = [d for at, d in samples if start <= at < end]
    return bool(inside) and all(d.get(t, 0) >= part for d in inside for t, part in parts.items())


def served_windows(
    db: str,
    tenants: tuple[str, str],
    since: float,
    samples: list[tuple[float, dict[str, int]]] | None = None,
    parts: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Judgments stored per tenant per 10 s window, while both tenants had groups running;
    each window says whether both were backlogged all through it (``samples``, ``parts``)."""
    with psycopg.connect(db.replace("postgresql+psycopg://", "postgresql://")) as conn:
        rows = conn.execute(
            "SELECT g.tenant, extract(epoch FROM j.created_at) FROM judgments j JOIN groups g ON g.id = j.group_pk"
            " WHERE g.tenant = ANY(%s) AND j.attempt_count > 0",
            (list(tenants),),
        ).fetchall()
    times = {t: sorted(float(at) for tenant, at in rows if tenant == t) for t in tenants}
    start = since + 2.0
    # Both are backlogged until the first of them is near the end of its work (its last
    # tenth: the stragglers of its longest chains, which no share speeds up).
    end = min(times[t][int(0.9 * (len(times[t]) - 1))] for t in tenants if times[t])
    out = []
    t = start
    while t + WINDOW_S <= end:
        counts = {x: sum(1 for at in times[x] if t <= at < t + WINDOW_S) for x in tenants}
        total = sum(counts.values())
        both = backlogged(samples, parts, t, t + WINDOW_S) if samples is not None and parts is not None else None
        out.append(
            {"from_s": t - since, **counts, "share": counts[tenants[0]] / total if total else None, "backlogged": both}
        )
        t += WINDOW_S
    return out


def judge_peak(judge: str) -> int:
    return int(stats([judge])[0].get("peak_in_flight", 0))


def reset_peak(judge: str) -> None:
    httpx.post(f"{judge}/reset", timeout=5)


class InFlightSampler(Sampler[int]):
    """The calls the judge holds (in its slots or waiting for one), read every second
    while a phase runs: a limit that drifts above the slots shows as calls queued inside
    the judge for minutes."""

    def __init__(self, judge: str):
        super().__init__()
        self.judge = judge

    def read(self) -> int:
        return int(stats([self.judge])[0].get("open", 0))

    def finish(self, slots: int) -> dict[str, Any]:
        ordered = sorted(self.stop()) or [0]
        return {
            "median": statistics.median(ordered),
            "p90": ordered[int(0.9 * (len(ordered) - 1))],
            "max": ordered[-1],
            "seconds_over_twice_the_slots": sum(1 for n in ordered if n > 2 * slots),
        }
