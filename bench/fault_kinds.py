"""The faults a campaign (:mod:`bench.faults`) injects into its stack, and their schedule.

Each kind breaks one part of :class:`bench.fault_stack.FaultStack` and brings it back after
a seeded downtime; :class:`Schedule` deals the kinds like a shuffled deck (every kind once
per round, in a seeded order) at seeded exponential gaps, one fault at a time.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from bench.fault_stack import FaultStack, Supervised

#: The workers a killed-worker fault picks from: the services a step's work passes through
#: (the outcome judge and the auditor run, but a step without judged outcomes or audits
#: leaves them idle).
BUSY_QUEUES = ("visit_judge", "snippet_matcher", "credit_aggregator")


@dataclass
class Fault:
    kind: str
    target: str
    #: Seconds since the campaign began: when the part broke and when it was back.
    started: float
    ended: float = 0.0
    detail: str = ""


@dataclass
class Injector:
    """Breaks and restores parts of ``stack``; ``down_s`` bounds each downtime (seconds)."""

    stack: FaultStack
    rng: random.Random
    down_s: tuple[float, float]
    clock: Callable[[], float]
    redis_restarts: int = 0

    def downtime(self) -> float:
        return round(self.rng.uniform(*self.down_s), 2)

    def worker(self) -> Fault:
        """SIGKILL of one worker, started again after the downtime (a restart policy's delay)."""
        victim = self.rng.choice([w for w in self.stack.workers if w.name.split()[-1] in BUSY_QUEUES])
        return self._killed("worker", victim)

    def judge(self) -> Fault:
        """SIGKILL of one judge replica, started again on its port after the downtime."""
        return self._killed("judge", self.stack.judges[self.rng.randrange(len(self.stack.judges))])

    def _killed(self, kind: str, victim: Supervised) -> Fault:
        down = self.downtime()
        fault = Fault(kind, victim.name, self.clock(), detail=f"SIGKILL, restarted after {down} s")
        self.stack.hold(victim)
        time.sleep(down)
        self.stack.release(victim)
        victim.wait_ready()
        fault.ended = self.clock()
        return fault

    def redis(self) -> Fault:
        """Redis killed (SIGKILL) and started again: from its append-only file, or (every
        other time) without it, as a server that lost its disk (every queued message gone)."""
        down = self.downtime()
        self.redis_restarts += 1
        keep = self.redis_restarts % 2 == 1
        server = self.stack.redis
        detail = f"SIGKILL, down {down} s, {'data kept' if keep else 'data lost'}"
        fault = Fault("redis", f"redis :{server.port}", self.clock(), detail=detail)
        server.stop()
        if not keep:
            shutil.rmtree(server.workdir / "appendonlydir", ignore_errors=True)
        time.sleep(down)
        server.start()
        fault.ended = self.clock()
        return fault

    def postgres(self) -> Fault:
        """Postgres stopped (``immediate``: a crash, or ``fast``) and started again."""
        mode = self.rng.choice(("immediate", "fast"))
        down = self.downtime()
        pg = self.stack.postgres
        fault = Fault("postgres", f"postgres :{pg.port}", self.clock(), detail=f"stop -m {mode}, down {down} s")
        pg.stop(mode)
        time.sleep(down)
        pg.start()
        pg.wait_ready()
        fault.ended = self.clock()
        return fault

    def garbage(self) -> Fault:
        """One judge replica answers garbage (200s no judgment can be read from) for a while."""
        index = self.rng.randrange(len(self.stack.judges))
        url = self.stack.judge_urls[index]
        seconds = round(self.rng.uniform(2 * self.down_s[0], 2 * self.down_s[1]), 2)
        fault = Fault("garbage", self.stack.judges[index].name, self.clock(), detail=f"garbage for {seconds} s")
        httpx.post(f"{url}/garbage", params={"seconds": seconds}, timeout=10).raise_for_status()
        time.sleep(seconds)
        fault.ended = self.clock()
        return fault

    def inject(self, kind: str) -> Fault:
        return {
            "worker": self.worker,
            "judge": self.judge,
            "redis": self.redis,
            "postgres": self.postgres,
            "garbage": self.garbage,
        }[kind]()


KINDS = ("worker", "judge", "redis", "postgres", "garbage")


class Schedule:
    """Injects faults one after another at seeded exponential gaps (mean ``gap_s``) until
    ``enough`` says so (or stopped); the kinds come as a shuffled deck, so every kind
    recurs once per round."""

    def __init__(self, injector: Injector, kinds: tuple[str, ...], gap_s: float, enough: Callable[[], bool]):
        self.injector, self.kinds, self.gap_s, self.enough = injector, kinds, gap_s, enough
        self.faults: list[Fault] = []
        #: The fault under way (its start), if any.
        self.current: Fault | None = None
        #: A fault that could not be injected or undone (it ends the campaign).
        self.errors: list[str] = []
        self._deck: list[str] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Inject no more; wait for the fault under way to be undone."""
        self._stopping.set()
        self._thread.join()

    def next_kind(self) -> str:
        if not self._deck:
            self._deck = list(self.kinds)
            self.injector.rng.shuffle(self._deck)
        return self._deck.pop()

    def count(self, kind: str) -> int:
        return sum(f.kind == kind for f in self.faults)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        rng = self.injector.rng
        while not self._stopping.wait(rng.expovariate(1 / self.gap_s)):
            if self.enough():
                return
            kind = self.next_kind()
            self.current = Fault(kind, "?", self.injector.clock())
            try:
                self.faults.append(self.injector.inject(kind))
            except Exception as exc:  # noqa: BLE001 - a fault that could not be undone ends the campaign
                self.errors.append(f"{kind} fault at {self.current.started:.1f} s: {type(exc).__name__}: {exc}")
                return
            finally:
                self.current = None
            f = self.faults[-1]
            print(f"  fault  {f.started:7.1f}-{f.ended:7.1f} s  {f.kind:<8} {f.target:<24} {f.detail}", flush=True)

    def last_end_before(self, moment: float) -> float | None:
        """When the last fault that began before ``moment`` ended (or is ongoing: inf)."""
        ends = [f.ended for f in self.faults if f.started < moment]
        current = self.current
        if current is not None and current.started < moment:
            ends.append(float("inf"))
        return max(ends, default=None)
