"""The API with the ``openai`` judge, wherever the test runs.

The trainer adapters' tests run in a venv whose ``openai`` release is older than the
judge needs (the ``prime-rl`` extra pins it below 3): there the service runs as
``drcredit serve`` from the project's own venv, as a deployment would run it apart
from the trainer; elsewhere in this process. A git worktree has no venv of its own: it
uses its main checkout's, with this checkout's code first on the path.
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


def project_python() -> Path:
    """The python of the project's venv: this checkout's ``.venv``, else (a git worktree)
    the main checkout's."""
    roots = [ROOT]
    try:
        common = subprocess.run(
            ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"], cwd=ROOT, capture_output=True, text=True
        )
    except OSError:  # no git: this checkout's venv or none
        common = None
    if common is not None and common.returncode == 0:
        roots.append(Path(common.stdout.strip()).parent)
    for root in roots:
        python = root / ".venv" / "bin" / "python"
        if python.exists():
            return python
    tried = ", ".join(str(root / ".venv") for root in roots)
    raise RuntimeError(f"the judge needs openai {OPENAI_MINIMUM}; the project's venv is missing (looked in {tried})")


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
    python = project_python()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRCREDIT_")}
    # This checkout's code, whichever checkout the venv installed editable.
    own = [str(ROOT / "shared"), str(ROOT / "services"), str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(own + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
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
