"""The workers' records of the queues they consume, on a real Redis: who counts as a live
consumer, since when a queue has none, and what is forgotten."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import orjson
import pytest
import redis

from drcredit.broker.consumers import KEY, ConsumerHeartbeat, ConsumerRegistry
from tests.distributed.test_distributed import redis_db

pytestmark = pytest.mark.infra


def test_a_record_counts_until_it_runs_out_or_is_withdrawn() -> None:
    with redis_db() as url:
        registry = ConsumerRegistry(url)
        registry.publish("w1", ["visit_judge", "snippet_matcher", "auditor"], 9101, ttl_s=60)
        registry.publish("w2", ["outcome_judge"], None, ttl_s=0.5)
        census = registry.census()
        assert [census.count(q) for q in ("visit_judge", "snippet_matcher", "outcome_judge")] == [1, 1, 1]
        assert census.without_consumer() == {"credit_aggregator": None}  # never had one
        assert [w["worker"] for w in census.document()["workers"]] == ["w1", "w2"]

        time.sleep(0.7)  # w2's record ran out 0.5 s after it was written: about 0.2 s ago
        census = registry.census()
        gone = census.without_consumer()
        assert set(gone) == {"outcome_judge", "credit_aggregator"}
        seen = gone["outcome_judge"]
        assert seen is not None and 0.05 < (datetime.now(UTC) - seen).total_seconds() < 0.7

        before = datetime.now(UTC)
        registry.withdraw("w1")
        gone = registry.census().without_consumer()
        assert set(gone) == {"visit_judge", "snippet_matcher", "outcome_judge", "credit_aggregator", "auditor"}
        seen = gone["visit_judge"]
        assert seen is not None and abs((seen - before).total_seconds()) < 2
        registry.close()


def test_unreadable_and_day_old_records_are_dropped_by_the_next_write() -> None:
    with redis_db() as url:
        client = redis.Redis.from_url(url)
        now = time.time()
        client.hset(KEY, "garbage", b"not json")
        client.hset(KEY, "old", orjson.dumps({"queues": ["visit_judge"], "until": now - 2 * 86_400}))
        client.hset(KEY, "recent", orjson.dumps({"queues": ["visit_judge"], "until": now - 60}))
        registry = ConsumerRegistry(url)
        assert registry.census().count("visit_judge") == 0  # none is alive; the garbage is no consumer
        registry.publish("w1", ["outcome_judge"], None, ttl_s=10)
        assert sorted(client.hkeys(KEY)) == [b"recent", b"w1"]
        assert 0 < client.ttl(KEY) <= 86_400
        registry.close()


def test_the_heartbeat_keeps_its_record_alive_and_withdraws_it_on_stop() -> None:
    with redis_db() as url:
        registry = ConsumerRegistry(url)
        heartbeat = ConsumerHeartbeat(registry, ["credit_aggregator"], 9104, ttl_s=0.6)
        heartbeat.start()
        try:
            first = time.monotonic() + 2.0
            while registry.census().count("credit_aggregator") == 0:  # its first write
                assert time.monotonic() < first
                time.sleep(0.01)
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:  # three record lifetimes: renewed all along
                assert registry.census().count("credit_aggregator") == 1
                time.sleep(0.1)
        finally:
            heartbeat.stop()
        heartbeat.join(2)
        assert not heartbeat.is_alive()
        assert registry.census().count("credit_aggregator") == 0  # at once, not when it runs out
        time.sleep(0.5)
        assert registry.census().count("credit_aggregator") == 0  # and no late write revived it
        registry.close()
