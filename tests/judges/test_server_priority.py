"""A judge server that orders its own queue by the requests' priority (vLLM's and SGLang's
priority scheduling), over real HTTP: an endpoint declared with ``priority`` is sent each
call's urgency, and a call from a long chain overtakes calls queued in the server before
it; an endpoint not declared so sends none, and the server's queue stays first come first
served.

The server is the benchmark's simulated judge, its prefill lane (one request at a time)
ordered by priority; each call prefills a prompt of its own (no cache hit), so the lane
queues them.
"""

from __future__ import annotations

import asyncio
import json
import time

from bench.judge_sim import Simulator, app
from bench.prefix_cache import PrefixCache

from drcredit.judges.base import RetryPolicy
from drcredit.judges.fleet.router import CALL_PRIORITY
from drcredit.judges.openai_judge import OpenAIJudge
from tests.judges.test_openai_judge import visit_request
from tests.support.live import serving

#: Seconds of prefill per uncached token: a visit prompt of ~400 tokens takes ~0.2 s.
PREFILL_S_PER_TOKEN = 0.0005


def finish_order(declared: str | None, lane: str | None) -> tuple[list[str], list[str], Simulator]:
    """Six calls of urgency 1 sent at once, then 0.25 s later one of urgency 40 (a long chain): the
    order their answers came back in, and the reasons of those that failed."""
    sim = Simulator(
        latency=0.0,
        sigma=0.0,
        concurrency=0,
        error_rate=0.0,
        seed=1,
        prefix=PrefixCache(4096, 256, PREFILL_S_PER_TOKEN, lane),
    )
    with serving(app(sim), lifespan="off") as url:
        endpoint = {"url": f"{url}/v1", **({"priority": declared} if declared else {})}
        judge = OpenAIJudge(
            base_url=json.dumps([endpoint]),
            model="sim",
            timeout_s=30.0,
            retry=RetryPolicy(max_attempts=1),
        )
        done: list[str] = []
        failed: list[str] = []

        async def call(urgency: int, name: str, after: float) -> None:
            await asyncio.sleep(after)
            CALL_PRIORITY.set(urgency)
            result = await judge.ajudge_visit(visit_request(prior=(f"{name} {time.monotonic()}",)))
            if result.status == "ok":
                done.append(name)
            else:
                failed.append(str(result.failure_reason))

        async def run() -> None:
            calls = [call(1, f"low{i}", 0.0) for i in range(6)]
            await asyncio.gather(*calls, call(40, "urgent", 0.25))
            await judge.aclose()

        asyncio.run(run())
    return done, failed, sim


def test_a_server_ordering_by_priority_serves_the_longest_chain_before_calls_queued_earlier() -> None:
    done, failed, sim = finish_order("lower-first", "lower-first")
    assert not failed
    # When the urgent call came, the first call was done and the second in the lane, four
    # waiting: it goes next (third), a loaded machine's slower start aside (fourth).
    assert done.index("urgent") <= 3, done
    assert sim.stats["requests"] == 7


def test_a_server_first_come_first_served_answers_the_urgent_call_after_those_before_it() -> None:
    done, failed, _ = finish_order(None, None)
    assert not failed
    assert done.index("urgent") == 6, done


def test_a_priority_sent_to_a_server_not_started_to_honour_it_is_refused_by_it() -> None:
    """Why ``priority`` is declared per endpoint: vLLM answers 400 to a priority it was
    not started to honour, and a bad request is not retried into a score."""
    done, failed, _ = finish_order("lower-first", None)
    assert not done and len(failed) == 7
    assert all("Priority scheduling is not enabled" in reason for reason in failed), failed[0]
