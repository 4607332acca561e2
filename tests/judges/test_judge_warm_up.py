"""A worker prepares its judge before work arrives: it asks the servers what they serve
at start, so the first step's calls do not wait for it, and a server that was not
ready then is asked again at the first call. Against servers started here over HTTP."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from drcredit.judges.base import RetryPolicy
from drcredit.judges.openai_judge import OpenAIJudge
from tests.judges.test_openai_judge import GOOD, visit_request
from tests.support.live import LiveServer, free_port


@dataclass
class FactsServer:
    """Serves ``max_model_len`` in /v1/models and one answer to every completion; the
    first ``not_ready`` questions about itself get a 503, as llama.cpp loading a model."""

    context: int
    not_ready: int = 0
    paths: list[str] = field(default_factory=list)

    def app(self) -> Starlette:
        async def models(request: Request) -> Response:
            self.paths.append(request.url.path)
            if self.not_ready > 0:
                self.not_ready -= 1
                return JSONResponse({"error": {"message": "Loading model"}}, status_code=503)
            return JSONResponse({"object": "list", "data": [{"id": "judge-test", "max_model_len": self.context}]})

        async def props(request: Request) -> Response:
            self.paths.append(request.url.path)
            if self.not_ready > 0:
                self.not_ready -= 1
                return JSONResponse({"error": {"message": "Loading model"}}, status_code=503)
            return JSONResponse({"error": {"message": "not found"}}, status_code=404)

        async def completions(request: Request) -> Response:
            self.paths.append(request.url.path)
            body = await request.json()
            return JSONResponse(
                {
                    "id": "c",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": json.dumps(GOOD)},
                        }
                    ],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
                }
            )

        return Starlette(
            routes=[
                Route("/v1/models", models),
                Route("/props", props),
                Route("/v1/chat/completions", completions, methods=["POST"]),
            ]
        )


def make_judge(port: int) -> OpenAIJudge:
    return OpenAIJudge(
        base_url=f"http://127.0.0.1:{port}/v1",
        model="judge-test",
        api_key="k",
        timeout_s=5.0,
        connect_timeout_s=1.0,
        retry=RetryPolicy(max_attempts=3, backoff_initial_s=0.01, backoff_max_s=0.05),
    )


def learned_context(judge: OpenAIJudge) -> int | None:
    assert judge.fleet is not None
    return judge.fleet.endpoints[0].record.context_tokens


def warm_then_call(
    judge: OpenAIJudge, facts: FactsServer, start: LiveServer | None = None
) -> tuple[int | None, list[str], int | None]:
    """Warm ``judge`` up, then (after starting ``start``, if given) make its first call:
    the context it knew and the paths the server had been asked after the warm-up, and
    the context it knows after the call."""

    async def run() -> tuple[int | None, list[str], int | None]:
        await judge.awarm()
        warmed, asked = learned_context(judge), list(facts.paths)
        if start is not None:
            await asyncio.to_thread(start.start)
        result = await judge.ajudge_visit(visit_request())
        assert result.status == "ok"
        await judge.aclose()
        return warmed, asked, learned_context(judge)

    try:
        return asyncio.run(run())
    finally:
        judge.close()


def test_a_warmed_judge_knows_the_context_before_its_first_call_and_asks_nothing_then() -> None:
    facts = FactsServer(context=4096)
    server = LiveServer(facts.app(), lifespan="off")
    server.start()
    try:
        known, asked_at_warm_up, _ = warm_then_call(make_judge(server.port), facts)
    finally:
        server.stop()
    assert known == 4096
    assert sorted(asked_at_warm_up) == ["/props", "/v1/models"]
    # The first call found the answers there: the server was asked nothing more.
    assert facts.paths[2:] == ["/v1/chat/completions"]


def test_a_server_still_loading_at_warm_up_is_asked_again_at_the_first_call() -> None:
    facts = FactsServer(context=2048, not_ready=2)
    server = LiveServer(facts.app(), lifespan="off")
    server.start()
    try:
        known, _, context = warm_then_call(make_judge(server.port), facts)
    finally:
        server.stop()
    assert known is None  # both questions got a 503
    assert context == 2048
    assert facts.paths[:2] == ["/v1/models", "/props"]
    assert sorted(facts.paths[2:4]) == ["/props", "/v1/models"] and facts.paths[4:] == ["/v1/chat/completions"]


def test_a_server_not_there_at_warm_up_is_asked_once_it_is() -> None:
    port = free_port()
    facts = FactsServer(context=8192)
    server = LiveServer(facts.app(), lifespan="off", port=port)
    try:
        # Nothing listens at the warm-up: no error, nothing learned; the server starts after it.
        known, _, context = warm_then_call(make_judge(port), facts, start=server)
    finally:
        server.stop()
    assert known is None
    assert context == 8192
    assert sorted(facts.paths[:2]) == ["/props", "/v1/models"] and facts.paths[2:] == ["/v1/chat/completions"]
