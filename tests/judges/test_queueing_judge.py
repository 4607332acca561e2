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
