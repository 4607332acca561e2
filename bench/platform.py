"""The processes of a measurement: the simulated judge, the API and workers, a fresh
database, and their CPU time read from /proc.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
from tests.support.infra import lease_redis_db, release_redis_db

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("DRCREDIT_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
#: DRCREDIT_BENCH_REDIS names the Redis database of the stacks; unset, each bench process
#: leases one of the local server's for itself (:func:`bench_redis`).
REDIS_SERVER = "redis://127.0.0.1:6379"
_redis: str | None = os.environ.get("DRCREDIT_BENCH_REDIS")
TICK = os.sysconf("SC_CLK_TCK")


def bench_redis() -> str:
    """The Redis database of this process's stacks (their broker and the fleet's records).

    Benchmarks run side by side on a shared machine: on one fixed database their workers
    took each other's messages (unit ids start from 1 in every database) and each run's
    ``flushdb`` dropped the other's queue. Unless DRCREDIT_BENCH_REDIS says which, a
    database no other process holds is leased until this process exits.
    """
    global _redis
    if _redis is None:
        url, key = lease_redis_db(REDIS_SERVER)
        atexit.register(release_redis_db, url, key)
        _redis = url
    return _redis


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def postgres_cpu() -> float:
    total = 0.0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "comm").read_text().strip().startswith("postgres"):
                    total += cpu_seconds(int(proc.name))
            except OSError:
                continue
    return total


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


@dataclass
class Stack:
    """The judge simulator, the API and workers of one measurement."""

    workdir: Path
    procs: list[Proc] = field(default_factory=list)

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        log = self.workdir / f"{name}-{len(self.procs)}.log"
        popen = subprocess.Popen(argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up")
        time.sleep(0.1)


def wait_log(proc: Proc, needle: bytes, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while needle not in proc.log.read_bytes():
        if proc.popen.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} did not start:\n{proc.log.read_text()[-2000:]}")
        time.sleep(0.1)


def start_judge(stack: Stack, latency: float, sigma: float, extra: list[str] | None = None, port: int = 0) -> str:
    """A simulated judge process (``extra``: more ``bench.judge_sim`` flags)."""
    port = port or free_port()
    argv = [
        sys.executable,
        "-m",
        "bench.judge_sim",
        "--port",
        str(port),
        "--latency",
        str(latency),
        "--lognormal-sigma",
        str(sigma),
        *(extra or []),
    ]
    stack.spawn("judge", argv, dict(os.environ))
    wait_http(f"http://127.0.0.1:{port}/stats")
    return f"http://127.0.0.1:{port}"


@contextmanager
def fresh_database() -> Iterator[str]:
    name = f"drcredit_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def platform_env(judge: str, database_url: str, broker: str | None, concurrency: int) -> dict[str, str]:
    """:func:`plain_env` tuned for the benchmark's own platform (quiet, concurrency set)."""
    env = plain_env(judge, database_url, broker)
    env.update(
        {
            "DRCREDIT_JUDGE_TIMEOUT_S": "600",
            "DRCREDIT_JUDGE_CONCURRENCY": str(concurrency),
            "DRCREDIT_LOG_LEVEL": "WARNING",
            "DRCREDIT_AUTO_MIGRATE": "true",
            "DRCREDIT_MAX_BODY_BYTES": str(1 << 30),
            "DRCREDIT_DATABASE_POOL_SIZE": "12",
        }
    )
    return env


def start_api(stack: Stack, env: dict[str, str]) -> tuple[str, Proc]:
    port = free_port()
    proc = stack.spawn("api", [sys.executable, "-m", "drcredit_cli.main", "serve", "--port", str(port)], env)
    wait_http(f"http://127.0.0.1:{port}/healthz")
    return f"http://127.0.0.1:{port}", proc


def start_worker(stack: Stack, env: dict[str, str], queues: str, concurrency: int) -> Proc:
    argv = [sys.executable, "-m", "drcredit_cli.main", "worker", "--queues", queues, "--concurrency", str(concurrency)]
    proc = stack.spawn(f"worker-{queues}", argv, {**env, "DRCREDIT_LOG_LEVEL": "INFO"})
    wait_log(proc, b" ready.")
    return proc


def plain_env(judge: str, database_url: str, broker: str | None) -> dict[str, str]:
    """What the README's set-up asks for (database, broker when distributed, judge), and
    answers reused only within a group."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRCREDIT_")}
    env.update(
        {
            "DRCREDIT_DATABASE_URL": database_url,
            "DRCREDIT_JUDGE": "openai",
            "DRCREDIT_JUDGE_BASE_URL": f"{judge}/v1",
            "DRCREDIT_JUDGE_MODEL": "sim",
        }
    )
    if broker:
        env["DRCREDIT_BROKER_URL"] = broker
    # A repeated step posts the same content under new group ids, which the default reuse
    # (``tenant``) would answer from the store without the judge: a benchmark of judging
    # keeps answers within a group, as a step of new rollouts would meet them.
    # (bench.prefix_reuse measures the store itself and sets ``tenant``.)
    env["DRCREDIT_JUDGE_REUSE"] = "group"
    return env


def start_plain(stack: Stack, env: dict[str, str], workers: int) -> tuple[str, list[Proc]]:
    """``drcredit serve`` and ``workers`` plain ``drcredit worker`` processes (no flags)."""
    port = free_port()
    api = stack.spawn("api", [sys.executable, "-m", "drcredit_cli.main", "serve", "--port", str(port)], env)
    wait_http(f"http://127.0.0.1:{port}/healthz")
    procs = [api]
    for _ in range(workers):
        worker = stack.spawn("worker", [sys.executable, "-m", "drcredit_cli.main", "worker"], env)
        wait_log(worker, b" ready.")
        procs.append(worker)
    return f"http://127.0.0.1:{port}", procs
