"""A judge server that queues (vLLM, SGLang, TGI): slots nobody states, FIFO inside.

The server (:mod:`tests.support.queueing_judge`) runs as a process of its own. The
platform learns its slots from the answers' latency against the server's own pace and
keeps the calls beyond them waiting on its side; a timeout under load lowers the limit
and does not take the endpoint out of the rotation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from drcredit.judges.base import JudgeResult, RetryPolicy
from drcredit.judges.fleet import limits
from drcredit.judges.openai_judge import OpenAIJudge
from tests.judges.test_openai_judge import visit_request
from tests.support.queueing_judge import queueing_judge

pytestmark = pytest.mark.timeout(180)


def judge_of(url: str, timeout_s: float, attempts: int = 3) -> OpenAIJudge:
    return OpenAIJudge(
        base_url=url,
        model="judge-test",
        timeout_s=timeout_s,
        retry=RetryPolicy(max_attempts=attempts, backoff_initial_s=0.01, backoff_max_s=0.05),
    )


async def in_waves(
    judge: OpenAIJudge, waves: list[int], between: Callable[[], Any] = lambda: None
) -> list[list[JudgeResult[Any]]]:
    """Each wave's judgments at once, a wave after the previous one's answers
    (``between``: called between waves)."""
    results: list[list[JudgeResult[Any]]] = []
    try:
        for k, n in enumerate(waves):
            if k:
                between()
            calls = [judge.ajudge_visit(visit_request(prior=(f"point {k}-{i}",))) for i in range(n)]
            results.append(list(await asyncio.gather(*calls)))
    finally:
        await judge.aclose()
    return results


def test_a_queueing_server_is_sent_about_its_slots_and_the_rest_wait_in_the_platform() -> None:
    """A first wave of 300 into 16 slots of 0.3 s: slow start sends over a hundred and the
    server queues them, each answer taking longer than the last: the platform reads the
    slots from them (Little's law: calls in flight x the no-load latency / latency) and
    sets its limit there. The next wave of 200 waits in the platform: the server's
    queue stays within the headroom."""
    slots, service = 16, 0.3
    counts: list[dict[str, int]] = []
    learned: list[limits.LimitState] = []
    with queueing_judge(slots, service) as server:
        judge = judge_of(server.url, timeout_s=10.0)

        def between() -> None:
            learned.append(judge.fleet.endpoints[0].record.limit)
            counts.append(server.reset())

        waves = asyncio.run(in_waves(judge, [300, 200], between))
        counts.append(server.stats())
    results = [r for wave in waves for r in wave]
    assert all(r.status == "ok" for r in results), [a.error for r in results for a in r.attempts]
    state = learned[0]
    assert state.queues and state.slots is not None
    # About the 16 slots (the client's own time adds a little to each answer), and the
    # limit near them (the headroom, and what additive increase added since).
    assert slots * 0.75 <= state.slots <= slots * 1.5, state
    assert state.limit <= 3 * slots, state
    # Every call sent once, none abandoned.
    assert [c["requests"] for c in counts] == [300, 200] and [c["abandoned"] for c in counts] == [0, 0]
    assert counts[0]["peak_queued"] >= 48
    # The second wave: at most the limit at the server, whose queue stays within it.
    assert counts[1]["peak_queued"] <= state.limit * 1.5, (counts, judge.fleet.endpoints[0].record.limit)


def test_a_timeout_under_load_lowers_the_limit_and_keeps_the_endpoint() -> None:
    """64 calls into 2 slots of 0.3 s with a 1.5 s timeout: those queued behind ten
    others time out while the server answers the rest. Each timeout lowers the limit
    before its retry is placed; the endpoint stays in the rotation and every judgment
    is answered in the end."""
    with queueing_judge(2, 0.3) as server:
        judge = judge_of(server.url, timeout_s=1.5, attempts=8)
        results = asyncio.run(in_waves(judge, [64]))[0]
        stats = server.stats()
    e = judge.fleet.endpoints[0]
    assert all(r.status == "ok" for r in results), [a.error for r in results for a in r.attempts]
    assert e.counts["timeout"] > 0  # the first wave's tail did time out
    assert e.health.up and e.health.outages == 0 and not judge.breaker.is_open
    assert e.record.limit.queues and e.limit <= 16, e.record.limit  # from 64
    # The first wave: 64 sent at once, 10 answered within 1.5 s (five rounds of two), 54
    # abandoned (sent before anything was known). Its retries wait in the platform for
    # the limit the timeouts lowered and for the server to work through the abandoned
    # calls: fewer are lost than there are judgments.
    assert stats["abandoned"] < 54 + 64, stats


def test_the_limit_follows_a_server_whose_slots_change() -> None:
    """16 slots of 0.3 s, learnt from a first wave; the server comes back with 4 (another
    ``--max-num-seqs``): the next waves' answers queue and the limit falls near 4; then
    with 32: answers come back at the base while the endpoint is busy, and the limit
    grows past what 4 slots needed."""
    learned: dict[str, limits.LimitState] = {}
    with queueing_judge(16, 0.3) as server:
        judge = judge_of(server.url, timeout_s=30.0)
        e = judge.fleet.endpoints[0]

        async def run() -> list[JudgeResult[Any]]:
            results: list[JudgeResult[Any]] = []
            waves = [(None, 300), (4, 120), (None, 120), (32, 300), (None, 300), (None, 300)]
            try:
                for k, (slots, n) in enumerate(waves):
                    if slots is not None:
                        learned[f"before {slots}"] = e.record.limit
                        server.set_slots(slots)
                    calls = [judge.ajudge_visit(visit_request(prior=(f"point {k}-{i}",))) for i in range(n)]
                    results += await asyncio.gather(*calls)
            finally:
                learned["end"] = e.record.limit
                await judge.aclose()
            return results

        results = asyncio.run(run())
        stats = server.stats()
    assert all(r.status == "ok" for r in results), [a.error for r in results for a in r.attempts]
    assert stats["abandoned"] == 0, stats
    at_16, at_4, end = learned["before 4"], learned["before 32"], learned["end"]
    assert at_16.queues and 12 <= (at_16.slots or 0) <= 24, at_16
    # 4 slots: the answers read as about 4, and the limit falls well below what 16 had
    # (from their estimate with its headroom it grows a few calls a round until the next
    # late answers: 13 here, against 37).
    assert 2.5 <= (at_4.slots or 0) <= 6 and at_4.limit < at_16.limit / 2, (at_16, at_4)
    # 32 slots: it grows again, past twice what 4 slots needed.
    assert end.limit >= 2 * at_4.limit, (at_4, end)


def test_a_server_that_slows_by_itself_is_rebased_not_cut_to_nothing() -> None:
    """16 slots of 0.2 s, learnt; then each call takes 0.6 s (other clients, longer
    prompts). Answers to calls sent within the limit are still 3x the old base: the
    first such verdict cuts (it looks like a queue), the next one, from calls sent
    within the cut limit once the calls from before it are answered, says the server
    itself slowed: the base is learnt again at about 0.6 s and the limit grows back,
    instead of being cut a third at every verdict."""
    with queueing_judge(16, 0.2) as server:
        judge = judge_of(server.url, timeout_s=30.0)
        e = judge.fleet.endpoints[0]
        seen: dict[str, Any] = {}

        def slower() -> None:
            seen["limit"] = e.record.limit
            server.set_service(0.6)

        waves = asyncio.run(in_waves(judge, [300, 400, 400], lambda: None if "limit" in seen else slower()))
        stats = server.stats()
    results = [r for wave in waves for r in wave]
    assert all(r.status == "ok" for r in results), [a.error for r in results for a in r.attempts]
    assert stats["abandoned"] == 0, stats
    before = seen["limit"]
    assert before.queues and 12 <= (before.slots or 0) <= 24, before
    # The base follows the slower server (rebased to its new pace, held there) ...
    assert e.latency.base is not None and 0.45 <= e.latency.base <= 0.9, e.latency.base
    # ... and the limit is still about the 16 slots, not a third of them.
    assert e.record.limit.limit >= 12, e.record.limit
