"""The API with the ``openai`` judge, wherever the test runs.

The trainer adapters' tests run in a venv whose ``openai`` release is older than the
judge needs (the ``prime-rl`` extra pins it below 3): there the service runs as
``drcredit serve`` from the project's own venv, as a deployment would run it apart
from the trainer; elsewhere in this process.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

from drcredit.judges.factory import OPENAI_MINIMUM
from drcredit_api.app import create_app
from tests.support.api import settings_for
from tests.support.live import free_port, serving

ROOT = Path(__file__).resolve().parents[2]


def judge_runs_here() -> bool:
    parts = tuple(int(p) for p in metadata.version("openai").split(".")[:2])
    return parts >= OPENAI_MINIMUM


@contextmanager
def judged_service(database_url: str, judge_url: str, **overrides: Any) -> Iterator[str]:
    """Serve the API judging through ``judge_url``; yields its base URL."""
    settings = settings_for(database_url, judge_url, **overrides)
    if judge_runs_here():
        with serving(create_app(settings)) as url:
            yield url
        return
    python = ROOT / ".venv" / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"the judge needs openai {OPENAI_MINIMUM}; the project's venv {python} is missing")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRCREDIT_")}
    for name, value in settings.model_dump().items():
        if value is not None and name in settings.model_fields_set:
            env[f"DRCREDIT_{name.upper()}"] = str(value)
    process = subprocess.Popen(
        [str(python), "-m", "drcredit_cli.main", "serve", "--port", str(port)], env=env, cwd=ROOT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                httpx.get(f"{url}/healthz", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if process.poll() is not None:
                    raise RuntimeError("drcredit serve exited at start") from None
                import time

                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(30)
