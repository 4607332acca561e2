"""Shared fixtures: a scripted OpenAI-compatible judge server and database URLs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.infra import postgres_database
from tests.support.judge_server import JudgeServer, marker_script, running_judge


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
