"""The client tests' service and clients: the real app served by uvicorn on a real port,
a proxy that answers 503 before forwarding, and clients of both kinds (the async one
driven through one ``asyncio.Runner`` per client)."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from drcredit.client import AsyncDrCreditClient, DrCreditClient
from drcredit_api.app import create_app
from tests.support.api import settings_for
from tests.support.judge_server import JudgeServer
from tests.support.live import free_port, serving

# ---------------------------------------------------------------------------- servers


@contextmanager
def running_service(tmp_path: Path, judge_url: str, **overrides: Any) -> Iterator[str]:
    """The real DrCredit app (lifespan, SQLite file, judge over HTTP) on a real port."""
    database = f"sqlite:///{tmp_path / f'drcredit-{free_port()}.sqlite3'}"
    with serving(create_app(settings_for(database, judge_url, **overrides))) as url:
        yield url


@pytest.fixture
def service(tmp_path: Path, marker_judge: JudgeServer) -> Iterator[str]:
    with running_service(tmp_path, marker_judge.url) as url:
        yield url


@dataclass
class Flaky:
    """A proxy answering 503 to the first ``failures[(method, path)]`` requests of a path."""

    upstream: str
    failures: dict[tuple[str, str], int] = field(default_factory=dict)
    seen: Counter[tuple[str, str]] = field(default_factory=Counter)
    bodies: list[bytes] = field(default_factory=list)
    #: Forward these requests, then answer 503 anyway: the server did the work, the client
    #: never heard (a connection lost after the server stored the batch).
    lose_answers: bool = False

    def app(self) -> Starlette:
        lock = threading.Lock()

        async def handle(request: Request) -> Response:
            key = (request.method, request.url.path)
            body = await request.body()
            with lock:
                self.seen[key] += 1
                n = self.seen[key]
                self.bodies.append(body)
            failing = n <= self.failures.get(key, 0)
            if failing and not self.lose_answers:
                return JSONResponse({"detail": f"warming up ({n})"}, status_code=503, headers={"Retry-After": "0"})
            headers = {k: v for k, v in request.headers.items() if k in ("content-type", "authorization")}
            async with httpx.AsyncClient(base_url=self.upstream, timeout=60) as client:
                answer = await client.request(
                    request.method, request.url.path, params=request.query_params, content=body, headers=headers
                )
            if failing:
                return JSONResponse({"detail": "answer lost"}, status_code=503, headers={"Retry-After": "0"})
            return Response(answer.content, answer.status_code, media_type=answer.headers.get("content-type"))

        return Starlette(routes=[Route("/{path:path}", handle, methods=["GET", "POST"])])


@contextmanager
def flaky_proxy(
    upstream: str, failures: dict[tuple[str, str], int], *, lose_answers: bool = False
) -> Iterator[tuple[str, Flaky]]:
    proxy = Flaky(upstream, failures, lose_answers=lose_answers)
    with serving(proxy.app(), lifespan="off") as url:
        yield url, proxy


# ---------------------------------------------------------------------------- clients


class AsyncAsSync:
    """Drives an :class:`AsyncDrCreditClient` from test code: one event loop for its life."""

    def __init__(self, base_url: str | None = None, **kw: Any) -> None:
        self._runner = asyncio.Runner()
        self._client = AsyncDrCreditClient(base_url, **kw)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **k: self._runner.run(attr(*a, **k))
        return attr

    def close(self) -> None:
        self._runner.run(self._client.close())
        self._runner.close()


Connect = Callable[..., DrCreditClient]


@pytest.fixture(params=["sync", "async"])
def connect(request: pytest.FixtureRequest) -> Iterator[Connect]:
    """Makes clients of the parametrized kind and closes them after the test."""
    made: list[Any] = []

    def make(base_url: str | None = None, **kw: Any) -> DrCreditClient:
        client: Any = DrCreditClient(base_url, **kw) if request.param == "sync" else AsyncAsSync(base_url, **kw)
        made.append(client)
        return cast(DrCreditClient, client)

    yield make
    for client in made:
        client.close()


@pytest.fixture(autouse=True)
def _no_client_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DRCREDIT_URL", raising=False)
    monkeypatch.delenv("DRCREDIT_API_KEY", raising=False)
