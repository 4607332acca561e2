"""What an OpenAI-compatible server says of itself: its context window and parallel
slots, whether it answers at all, and how many tokens a prompt takes.

Asked once per endpoint and process, as a worker starts (again at its first call if it
did not answer then, and after it rejoins the rotation): vLLM's
``max_model_len`` in ``/v1/models``, llama.cpp's per-slot ``n_ctx`` and ``total_slots``
in ``/props`` (:func:`drcredit.judges.context.served_context`). A prompt whose size
decides its room is counted by the server's own tokenizer when it has one: llama.cpp
renders the chat template (``/apply-template``) and counts it (``/tokenize``); vLLM
counts the messages (``/tokenize``). A server with neither leaves the platform its
conservative estimate (:class:`drcredit.judges.context.TokenRatio`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx2
import openai
import orjson
from openai import AsyncOpenAI

from drcredit.judges.context import served_context
from drcredit.judges.fleet.endpoints import EndpointConfig
from drcredit.judges.fleet.router import Fleet


class ServerFacts:
    """Per judge: what each of its endpoints says of itself (engine loop only)."""

    def __init__(self, fleet: Fleet, client: Callable[[EndpointConfig], AsyncOpenAI], model: str, timeout_s: float):
        self.fleet = fleet
        self._client = client
        self.model = model
        self.timeout_s = timeout_s
        self._asked: dict[str, asyncio.Task[bool]] = {}
        #: Per endpoint, how it counts tokens: "llama.cpp", "vllm", or None (it cannot).
        self._counting: dict[str, str | None] = {}

    @property
    def complete(self) -> bool:
        return len(self._asked) >= len(self.fleet.endpoints)

    async def ask_all(self) -> None:
        """Ask every endpoint not asked yet (concurrent calls share one question)."""
        await asyncio.gather(*(self.ask(e.config) for e in self.fleet.endpoints))

    async def ask(self, e: EndpointConfig) -> bool:
        """Ask ``e`` once; whether it answered at all."""
        task = self._asked.get(e.url)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._ask(e))
            self._asked[e.url] = task
        return await asyncio.shield(task)

    async def warm(self) -> None:
        """Ask every endpoint now, before any call. One that does not answer at all (a
        server still starting, or none there yet) is asked again at the first call."""
        configs = [e.config for e in self.fleet.endpoints]
        said = await asyncio.gather(*(self.ask(c) for c in configs))
        for config, answered in zip(configs, said, strict=True):
            if not answered:
                self.forget(config.url)

    def forget(self, url: str | None = None) -> None:
        """Ask again before the next call (an endpoint back in the rotation; a new loop)."""
        if url is None:
            self._asked.clear()
        else:
            self._asked.pop(url, None)

    async def _ask(self, e: EndpointConfig) -> bool:
        """Ask ``e`` what it serves; whether it answered at all (any status)."""
        reached_models, models = await self._get_json(e, e.url + "/models")
        reached_props, props = await self._get_json(e, _root(e) + "/props")
        context, slots = served_context(models, props)
        if context or slots:
            self.fleet.learn(e.url, context_tokens=context, slots=slots)
        return reached_models or reached_props

    async def health_check(self, e: EndpointConfig) -> str | None:
        """An endpoint out of the rotation answers at all (None), or why it does not."""
        try:
            await self._client(e).get(
                e.url + "/models", cast_to=httpx2.Response, options={"max_retries": 0, "timeout": self.timeout_s}
            )
        except openai.APIStatusError:
            pass  # an answer of any status: the server is there
        except openai.APIError as exc:
            cause = exc.__cause__ or exc
            return f"health check: {type(cause).__name__}: {cause}"
        self.forget(e.url)  # ask it again what it serves
        return None

    async def count_tokens(self, e: EndpointConfig, messages: list[dict[str, str]]) -> int | None:
        """The prompt's tokens by the server's own count (None: it cannot count)."""
        way = self._counting.get(e.url, "unknown")
        if way in ("unknown", "llama.cpp"):
            rendered = await self._post_json(e, _root(e) + "/apply-template", {"messages": messages})
            if isinstance(rendered, dict) and isinstance(rendered.get("prompt"), str):
                body = {"content": rendered["prompt"], "add_special": True, "parse_special": True}
                tokens = await self._post_json(e, _root(e) + "/tokenize", body)
                if isinstance(tokens, dict) and isinstance(tokens.get("tokens"), list):
                    self._counting[e.url] = "llama.cpp"
                    return len(tokens["tokens"])
        if way in ("unknown", "vllm"):
            counted = await self._post_json(e, _root(e) + "/tokenize", {"model": self.model, "messages": messages})
            if isinstance(counted, dict) and isinstance(counted.get("count"), int):
                self._counting[e.url] = "vllm"
                return int(counted["count"])
        self._counting[e.url] = None
        return None

    async def _get_json(self, e: EndpointConfig, url: str) -> tuple[bool, Any]:
        """Whether the server answered at all, and the JSON it answered (None: none)."""
        try:
            response = await self._client(e).get(
                url, cast_to=httpx2.Response, options={"max_retries": 0, "timeout": self.timeout_s}
            )
        except openai.APIStatusError as exc:
            # A 4xx: there, without the route; a 5xx: not ready (llama.cpp while loading).
            return exc.status_code < 500, None
        except Exception:  # noqa: BLE001 - the server need not say: the platform learns from its answers
            return False, None
        try:
            return True, orjson.loads(response.content)
        except orjson.JSONDecodeError:
            return True, None

    async def _post_json(self, e: EndpointConfig, url: str, body: Any) -> Any:
        try:
            response = await self._client(e).post(
                url,
                content=orjson.dumps(body),
                cast_to=httpx2.Response,
                options={"max_retries": 0, "timeout": self.timeout_s},
            )
            return orjson.loads(response.content)
        except Exception:  # noqa: BLE001 - a server without the endpoint: it cannot count
            return None


def _root(e: EndpointConfig) -> str:
    """The server's root: the base URL without its ``/v1``."""
    return e.url[: -len("/v1")] if e.url.endswith("/v1") else e.url
