"""Which queues a live worker consumes, said by the workers in Redis and read by the API
and the sweepers.

A queue nobody consumes is otherwise silent: its messages wait in Redis and its groups
stay ``running``. So each worker keeps a record in the hash :data:`KEY` (field: the
worker; value: its queues, host, pid and metrics port, and until when the record holds),
written again every third of ``DRCREDIT_CONSUMER_TTL_S`` by a thread of its own
(:class:`ConsumerHeartbeat`). A worker that stops cleanly marks its record expired at
once; one that is killed stops renewing it and counts as gone when it runs out. Times
are the Redis server's clock, so processes on hosts whose clocks differ agree. Gone
workers' records are kept for a day: they say when each queue last had a consumer.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from drcredit.broker.queues import ALL_QUEUES

log = logging.getLogger("drcredit.consumers")

KEY = "drcredit:consumers"
#: How long the record of a gone worker is kept (it dates its queues' last consumer).
FORGET_AFTER_S = 86_400.0


def worker_id() -> str:
    """This process, as its record names it."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _stamp(unix: float) -> datetime:
    return datetime.fromtimestamp(unix, UTC)


@dataclass(frozen=True)
class Consumer:
    """One worker's record."""

    worker: str
    queues: tuple[str, ...]
    host: str
    pid: int
    metrics_port: int | None
    #: Unix time (the Redis server's clock) the record holds until.
    until: float

    @classmethod
    def from_json(cls, worker: str, raw: bytes | str) -> Consumer | None:
        try:
            data = orjson.loads(raw)
            return cls(
                worker,
                tuple(str(q) for q in data["queues"]),
                str(data.get("host", "")),
                int(data.get("pid", 0)),
                int(data["metrics_port"]) if data.get("metrics_port") else None,
                float(data["until"]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None  # a record this release cannot read counts as no consumer


@dataclass(frozen=True)
class Census:
    """The consumers and queue lengths at one moment (``now``, the Redis clock)."""

    now: float
    consumers: tuple[Consumer, ...]
    #: Messages waiting in each queue.
    messages: Mapping[str, int]

    def live(self) -> list[Consumer]:
        return [c for c in self.consumers if c.until > self.now]

    def count(self, queue: str) -> int:
        return sum(1 for c in self.live() if queue in c.queues)

    def last_seen(self, queue: str) -> datetime | None:
        """When the queue's last consumer was last known alive (None: none ever was)."""
        ends = [c.until for c in self.consumers if queue in c.queues]
        return _stamp(min(max(ends), self.now)) if ends else None

    def without_consumer(self, queues: Iterable[str] = ALL_QUEUES) -> dict[str, datetime | None]:
        """The queues no live worker consumes, each with :meth:`last_seen`."""
        return {q: self.last_seen(q) for q in queues if self.count(q) == 0}

    def document(self) -> dict[str, Any]:
        """The ``queues`` part of ``/readyz`` (docs/api.md)."""
        return {
            "without_consumer": list(self.without_consumer()),
            "by_queue": [
                {
                    "queue": q,
                    "consumers": self.count(q),
                    "messages": self.messages.get(q, 0),
                    "last_consumer_seen": None if self.count(q) else _iso(self.last_seen(q)),
                }
                for q in ALL_QUEUES
            ],
            "workers": [
                {
                    "worker": c.worker,
                    "queues": list(c.queues),
                    "host": c.host,
                    "pid": c.pid,
                    "metrics_port": c.metrics_port,
                }
                for c in sorted(self.live(), key=lambda c: c.worker)
            ],
        }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


class ConsumerRegistry:
    """The records in Redis: written by workers, read by everyone."""

    def __init__(self, url: str):
        import redis

        self.client: Any = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)

    def _now(self) -> float:
        seconds, micros = self.client.time()
        return float(seconds) + float(micros) / 1e6

    def publish(self, worker: str, queues: Iterable[str], metrics_port: int | None, ttl_s: float) -> None:
        """Say that ``worker`` consumes ``queues`` for the next ``ttl_s`` seconds."""
        now = self._now()
        record = {
            "queues": list(queues),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "metrics_port": metrics_port,
            "until": now + ttl_s,
        }
        forgotten = [
            field
            for field, raw in self.client.hgetall(KEY).items()
            if (c := Consumer.from_json(field.decode(), raw)) is None or c.until < now - FORGET_AFTER_S
        ]
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(KEY, worker, orjson.dumps(record))
            if forgotten:
                pipe.hdel(KEY, *forgotten)
            pipe.expire(KEY, int(FORGET_AFTER_S))
            pipe.execute()

    def withdraw(self, worker: str) -> None:
        """``worker`` consumes nothing from now on (its record stays, dated now)."""
        raw = self.client.hget(KEY, worker)
        consumer = Consumer.from_json(worker, raw) if raw is not None else None
        if consumer is None:
            return
        record = {
            "queues": list(consumer.queues),
            "host": consumer.host,
            "pid": consumer.pid,
            "metrics_port": consumer.metrics_port,
            "until": self._now(),
        }
        self.client.hset(KEY, worker, orjson.dumps(record))

    def census(self, queues: Iterable[str] = ALL_QUEUES) -> Census:
        names = list(queues)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.hgetall(KEY)
            for queue in names:
                pipe.llen(queue)
            (seconds, micros), records, *lengths = pipe.execute()
        consumers = (Consumer.from_json(field.decode(), raw) for field, raw in records.items())
        return Census(
            float(seconds) + micros / 1e6,
            tuple(c for c in consumers if c is not None),
            dict(zip(names, (int(n) for n in lengths), strict=True)),
        )

    def close(self) -> None:
        self.client.close()


class CachedCensus:
    """A census at most ``max_age_s`` old, shared by a process's request threads, so a
    burst of status reads costs one Redis round trip."""

    def __init__(self, registry: ConsumerRegistry, max_age_s: float = 1.0):
        self.registry = registry
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._taken = 0.0
        self._census: Census | None = None

    def get(self) -> Census:
        with self._lock:
            if self._census is None or time.monotonic() - self._taken > self.max_age_s:
                self._census = self.registry.census()
                self._taken = time.monotonic()
            return self._census


class ConsumerHeartbeat(threading.Thread):
    """Keeps this worker's record alive while it consumes; :meth:`stop` withdraws it.

    A thread of its own, not the sweeper's: a slow sweep (a large backlog, a database
    away) must not make a live worker look gone.
    """

    def __init__(self, registry: ConsumerRegistry, queues: Iterable[str], metrics_port: int | None, ttl_s: float):
        super().__init__(name="drcredit-consumer-heartbeat", daemon=True)
        self.registry = registry
        self.queues = tuple(queues)
        self.metrics_port = metrics_port
        self.ttl_s = ttl_s
        self.worker = worker_id()
        self._stopped = threading.Event()
        #: Held while the record is written, so that no write lands after the withdrawal.
        self._writing = threading.Lock()

    def run(self) -> None:
        failing = False
        while True:
            with self._writing:
                if self._stopped.is_set():
                    return
                try:
                    self.registry.publish(self.worker, self.queues, self.metrics_port, self.ttl_s)
                    if failing:
                        log.info("consumer record of %s written again", self.worker)
                    failing = False
                except Exception:  # Redis away: the record runs out, as it should
                    if not failing:
                        log.warning("could not write the consumer record of %s", self.worker, exc_info=True)
                    failing = True
            self._stopped.wait(self.ttl_s / 3)

    def stop(self) -> None:
        """This worker takes no more messages: say so now rather than when the record runs out."""
        self._stopped.set()
        with self._writing:
            try:
                self.registry.withdraw(self.worker)
            except Exception:  # the record runs out on its own
                log.warning("could not withdraw the consumer record of %s", self.worker, exc_info=True)
