"""Shared fixtures: a scripted OpenAI-compatible judge server and database URLs, and a
guard against a test module leaving an event loop running on the main thread."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.infra import postgres_database
from tests.support.judge_server import JudgeServer, marker_script, running_judge


@pytest.fixture(autouse=True, scope="module")
def no_event_loop_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """The suite runs in random order: a module that leaves a loop running on the main
    thread (Playwright's sync API does while it is open) would make every later test that
    calls ``asyncio.run`` fail, depending on the order. Set up before and torn down after
    every other fixture of the module, this fails the module that leaves one instead."""
    yield
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    pytest.fail(f"{request.node.nodeid} left an event loop running on the main thread: {loop!r}")


@pytest.fixture
def marker_judge() -> Iterator[JudgeServer]:
    """A judge server answering from markers in the page text (see ``marker_answer``)."""
    with running_judge(marker_script) as server:
        yield server


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Each API test runs on the embedded SQLite file and on a fresh Postgres database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'drcredit.sqlite3'}"
    else:
        with postgres_database() as url:
            yield url
