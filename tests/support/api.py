"""An API client over the real app (lifespan, database, judge over HTTP)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient

from drcredit.settings import Settings
from drcredit_api.app import create_app


def settings_for(database_url: str, judge_url: str | None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "auto_migrate": True,
        "judge": "openai" if judge_url else "offline",
        "judge_base_url": judge_url,
        "judge_model": "judge-test" if judge_url else "offline-lexical-v1",
        "judge_max_attempts": 2,
        "judge_backoff_initial_s": 0.01,
        "judge_backoff_max_s": 0.05,
        "judge_timeout_s": 10.0,
        "judge_concurrency": 16,
        "broker_url": None,
    }
    values.update(overrides)
    return Settings(**values)


@contextmanager
def api_client(database_url: str, judge_url: str | None, **overrides: Any) -> Iterator[TestClient]:
    app = create_app(settings_for(database_url, judge_url, **overrides))
    with TestClient(app) as client:
        yield client
