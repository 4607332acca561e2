"""A real llama.cpp server under load from the platform: more calls than slots, and a
whole group scored through the API with ``DRCREDIT_JUDGE=openai``.

The server says how many slots it has (``/props`` ``total_slots``); the platform holds
the calls beyond them itself, so a call's answer timeout runs only while the server works
on it, never while it waits for a slot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from drcredit.judges.base import JudgeResult, RetryPolicy
from drcredit.judges.openai_judge import OpenAIJudge
from tests.judges.test_openai_judge import snippet_request
from tests.support.api import api_client
from tests.support.builders import answer, group_doc, page, rollout, rubric, search, visit
from tests.support.llama_server import MODEL, LlamaServer, running_llama
from tests.support.recording_proxy import recording_proxy

pytestmark = pytest.mark.timeout(300)

CALLS = 12


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    with running_llama(tmp_path_factory.mktemp("llama"), ctx=4096, parallel=2) as server:
        yield server


def test_calls_beyond_the_slots_wait_in_the_platform_and_never_time_out_there(llama: LlamaServer) -> None:
    with recording_proxy(llama.root) as proxy:
        # One call alone, its prompt already cached: how long the server takes to serve one.
        warm = OpenAIJudge(base_url=proxy.url, model=MODEL, max_tokens=48, retry=RetryPolicy(1))
        warm.judge_snippets(snippet_request())
        warm.judge_snippets(snippet_request())
        alone = proxy.chats()[-1]
        service_s = alone.seconds
        body = alone.request

        # The same request sent straight to the server, all at once: the calls beyond
        # its two slots queue inside it, and the last answers far later than one call takes.
        with ThreadPoolExecutor(CALLS) as pool:
            direct = list(pool.map(lambda _: _timed_post(llama.url, body), range(CALLS)))
        timeout_s = max(3 * service_s, 2.0)
        assert max(direct) > timeout_s, (direct, service_s)

        # Through the platform, with that timeout: it learns the two slots, sends no more,
        # and no call times out however long it waited for a slot.
        proxy.exchanges.clear()
        judge = OpenAIJudge(
            base_url=proxy.url,
            model=MODEL,
            max_tokens=48,
            timeout_s=timeout_s,
            retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.05),
        )
        results, waited = asyncio.run(_judge_at_once(judge, CALLS))

    endpoint = judge.fleet.endpoints[0]
    assert endpoint.record.slots == 2 and endpoint.limit <= 2
    assert proxy.peak_in_flight == 2
    outcomes = {a.outcome for r in results for a in r.attempts}
    assert outcomes <= {"ok", "invalid"}, [a.error for r in results for a in r.attempts]
    assert not judge.breaker.is_open and endpoint.health.up
    # The calls waited longer than the timeout in all, but in the platform: at the server
    # each took about what one alone takes.
    assert max(waited) > timeout_s
    assert max(x.seconds for x in proxy.chats()) < timeout_s
    print(
        f"one call alone {service_s:.2f} s; {CALLS} at once straight to the server: last {max(direct):.2f} s;"
        f" through the platform: last done after {max(waited):.2f} s, longest at the server"
        f" {max(x.seconds for x in proxy.chats()):.2f} s (timeout {timeout_s:.2f} s)"
    )


def _timed_post(url: str, body: dict[str, Any]) -> float:
    started = time.monotonic()
    httpx.post(url + "/chat/completions", json=body, timeout=120).raise_for_status()
    return time.monotonic() - started


async def _judge_at_once(judge: OpenAIJudge, n: int) -> tuple[list[JudgeResult[Any]], list[float]]:
    started = time.monotonic()
    waited: list[float] = []

    async def one() -> JudgeResult[Any]:
        result = await judge.ajudge_snippets(snippet_request())
        waited.append(time.monotonic() - started)
        return result

    try:
        return list(await asyncio.gather(*(one() for _ in range(n)))), waited
    finally:
        await judge.aclose()


def _small_group() -> dict[str, Any]:
    return group_doc(
        rollout(
            "a",
            search(("S1", "https://n.org/1", "The plant opened in 2019 after two years of building.")),
            visit(page("W1", "https://a.org/x", "The plant opened in 2019. It makes batteries for buses.")),
            answer("It opened in 2019."),
            reward=1.0,
        ),
        rollout(
            "b",
            visit(page("W2", "https://b.org/y", "Opening hours of the museum: 9 to 5 on weekdays.")),
            answer("Unknown."),
            reward=0.0,
        ),
        rubrics=[rubric("R1", description="The answer gives the year the plant opened (2019)")],
        question="When did the battery plant open?",
        group_id="llama-g1",
    )


def _judgments(node: Any) -> list[dict[str, Any]]:
    """Every judgment entry of a credits document, wherever it sits."""
    if isinstance(node, dict):
        found = [node] if {"kind", "status", "attempts"} <= node.keys() else []
        return found + [j for value in node.values() for j in _judgments(value)]
    if isinstance(node, list):
        return [j for value in node for j in _judgments(value)]
    return []


def test_a_group_scored_through_the_api_on_a_real_judge_ends_done(llama: LlamaServer, tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'drcredit.sqlite3'}"
    with api_client(
        database,
        llama.url,
        judge_model=MODEL,
        judge_max_tokens=192,
        judge_timeout_s=60.0,
        judge_max_attempts=2,
    ) as client:
        assert client.post("/v1/groups", json=_small_group()).status_code == 202
        doc = client.get("/v1/groups/llama-g1/advantages", params={"wait": 240}).json()
        assert doc["status"] == "done", doc
        status = client.get("/v1/groups/llama-g1").json()
        credits = client.get("/v1/groups/llama-g1/credits").json()
    progress = status["progress"]
    judgments = _judgments(credits)
    assert progress["judgments_total"] == len(judgments) >= 3
    assert progress["judgments_done"] == progress["judgments_total"]
    assert progress["judgments_failed"] == sum(1 for j in judgments if j["status"] == "failed")
    for j in judgments:
        assert j["status"] in ("ok", "failed") and j["attempts"]
        if j["status"] == "failed":
            assert j["failure_reason"], j
        else:
            assert j["model"] == MODEL and j["prompt_tokens"] > 0
    assert progress["judge_calls"] >= len(judgments)
    assert status["judge"]["model"] == MODEL


@pytest.mark.timeout(900)
def test_without_its_slots_stated_the_platform_sees_the_queue_and_sends_fewer(llama: LlamaServer) -> None:
    """The same server with ``/props`` hidden, as vLLM or SGLang would be: nothing says it
    has two slots. Three calls one after another show its time for a call alone; then,
    with a cap of 12 (an operator's guess), 24 calls at once: their answers come back
    several service times later, queued in the server, and the platform estimates its
    slots from them (Little's law); every call is answered, none times out."""
    import json

    with recording_proxy(llama.root, refuse=("/props",)) as proxy:
        endpoints = json.dumps([{"url": proxy.url, "max_concurrency": 12}])
        judge = OpenAIJudge(
            base_url=endpoints,
            model=MODEL,
            max_tokens=16,
            timeout_s=600,
            retry=RetryPolicy(max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.05),
        )

        async def alone_then_at_once() -> list[JudgeResult[Any]]:
            alone = [await judge.ajudge_snippets(snippet_request()) for _ in range(3)]
            results, _ = await _judge_at_once(judge, 24)
            return alone + results

        results = asyncio.run(alone_then_at_once())

    endpoint = judge.fleet.endpoints[0]
    assert endpoint.record.slots is None  # not stated
    outcomes = {a.outcome for r in results for a in r.attempts}
    assert outcomes <= {"ok", "invalid"}, [a.error for r in results for a in r.attempts]
    state = endpoint.record.limit
    # It saw the queue and estimated about the two slots (one thread shares them: a busy
    # slot runs slower, so fewer than two calls' worth of throughput is possible too);
    # the limit was set there and probes upward again a few calls a round.
    assert state.queues and state.slots is not None, state
    assert 0.5 <= state.slots <= 4, state
    print(f"learned slots {state.slots:.1f}, limit {state.limit:.1f} (2 slots, cap 12); peak {proxy.peak_in_flight}")
