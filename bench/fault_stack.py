"""The distributed stack a fault campaign (:mod:`bench.faults`) breaks: every part of its own.

A Postgres cluster and a Redis server of its own on free ports (the shared servers other
work uses are never stopped), simulated judge replicas (:mod:`bench.judge_sim`) on fixed
ports, ``drcredit serve`` and one ``drcredit worker`` per worker service of
:data:`drcredit.broker.queues.WORKER_SERVICES`. A supervisor starts again any process that
exits on its own, as a deployment's restart policy does (docker compose's ``restart``, a
Kubernetes Deployment); a process a fault holds down stays down until the fault lets go.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from tests.support.services import PrivatePostgres, PrivateRedis

from bench.platform import ROOT, free_port, plain_env, wait_http
from drcredit.broker.queues import AUDITOR, WORKER_SERVICES
from drcredit.storage.migrate import upgrade

#: Celery threads and judge calls in flight of each worker (the auditor's are its own).
WORKER_CONCURRENCY = 8


@dataclass
class Supervised:
    """One process of the stack, started again by the supervisor when it exits unless held."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    ready_url: str | None = None
    popen: subprocess.Popen[bytes] | None = None
    #: Held down by a fault: the supervisor leaves it stopped.
    held: bool = False
    #: Times it exited on its own and was started again.
    restarts: int = 0
    starts: int = 0
    #: Where the log of the latest start begins.
    _log_from: int = 0

    def start(self) -> None:
        self._log_from = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as sink:
            sink.write(f"\n===== start {self.starts + 1} at {time.strftime('%H:%M:%S')} =====\n".encode())
            sink.flush()
            self.popen = subprocess.Popen(self.argv, env=self.env, stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
        self.starts += 1

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: no chance to hand anything back."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(20)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def wait_ready(self, timeout: float = 90) -> None:
        if self.ready_url is not None:
            wait_http(self.ready_url, timeout)
            return
        deadline = time.monotonic() + timeout
        while b" ready." not in self.log.read_bytes()[self._log_from :]:
            if not self.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)


@dataclass
class FaultStack:
    """Postgres, Redis, judge replicas, the API and the workers of one campaign."""

    workdir: Path
    replicas: int = 2
    latency: float = 0.3
    sigma: float = 0.5
    postgres: PrivatePostgres = field(init=False)
    redis: PrivateRedis = field(init=False)
    judges: list[Supervised] = field(default_factory=list)
    api: Supervised | None = None
    workers: list[Supervised] = field(default_factory=list)
    api_url: str = ""
    #: What killed judge replicas had counted (``/stats``) before they were killed.
    judge_counts_before: Counter[str] = field(default_factory=Counter)
    _pg_dir: Path | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def processes(self) -> list[Supervised]:
        return [*self.judges, *([self.api] if self.api else []), *self.workers]

    @property
    def judge_urls(self) -> list[str]:
        return [j.ready_url.rsplit("/", 1)[0] for j in self.judges if j.ready_url]

    def up(self) -> None:
        # The cluster runs as the postgres user: in a directory of its own under /tmp,
        # which that user can reach (a workdir under a private directory may not be).
        pg_dir = self._pg_dir = Path(tempfile.mkdtemp(prefix="drcredit-faults-pg-"))
        redis_dir = self.workdir / "redis"
        redis_dir.mkdir()
        self.postgres = PrivatePostgres(pg_dir)
        self.postgres.init()
        self.postgres.start()
        self.postgres.wait_ready()
        redis_dir.chmod(0o777)
        self.redis = PrivateRedis(redis_dir, appendonly=True)
        self.redis.start()
        upgrade(self.postgres.url)
        for k in range(self.replicas):
            port = free_port()
            argv = [sys.executable, "-m", "bench.judge_sim", "--port", str(port), "--latency", str(self.latency)]
            argv += ["--lognormal-sigma", str(self.sigma), "--seed", str(k)]
            self.judges.append(
                Supervised(
                    f"judge-{k}",
                    argv,
                    dict(os.environ),
                    self.workdir / f"judge-{k}.log",
                    f"http://127.0.0.1:{port}/stats",
                )
            )
        env = plain_env(self.judge_urls[0], self.postgres.url, self.redis.url)
        env["DRCREDIT_JUDGE_BASE_URL"] = ",".join(f"{u}/v1" for u in self.judge_urls)
        env["DRCREDIT_LOG_LEVEL"] = "WARNING"
        port = free_port()
        cli = [sys.executable, "-m", "drcredit_cli.main"]
        self.api_url = f"http://127.0.0.1:{port}"
        self.api = Supervised(
            "api", [*cli, "serve", "--port", str(port)], env, self.workdir / "api.log", f"{self.api_url}/healthz"
        )
        for service in WORKER_SERVICES:
            argv = [*cli, "worker", "--queues", str(service.queue)]
            if service.queue != AUDITOR:
                argv += ["--concurrency", str(WORKER_CONCURRENCY)]
            log = self.workdir / f"worker-{service.queue}.log"
            self.workers.append(Supervised(f"worker {service.queue}", argv, {**env, "DRCREDIT_LOG_LEVEL": "INFO"}, log))
        for process in self.processes:
            process.start()
        for process in self.processes:
            process.wait_ready()
        threading.Thread(target=self._supervise, name="supervisor", daemon=True).start()

    def _supervise(self) -> None:
        while not self._stopping.wait(0.5):
            with self._lock:
                for process in self.processes:
                    if not process.held and process.popen is not None and process.popen.poll() is not None:
                        process.restarts += 1
                        process.start()

    def hold(self, process: Supervised) -> None:
        """Kill ``process`` (SIGKILL) and keep it down until :meth:`release`."""
        if process in self.judges:
            stats = self.judge_stats()[self.judges.index(process)]
            self.judge_counts_before.update({k: stats.get(k, 0) for k in ("requests", "garbage")})
        with self._lock:
            process.held = True
            process.kill()

    def release(self, process: Supervised) -> None:
        with self._lock:
            process.held = False
            process.start()

    def judge_counts(self) -> Counter[str]:
        """Requests and garbage answers of every replica over the campaign (a killed
        replica's up to its last ``/stats`` read before the kill)."""
        total = Counter(self.judge_counts_before)
        for stats in self.judge_stats():
            total.update({k: stats.get(k, 0) for k in ("requests", "garbage")})
        return total

    def judge_stats(self) -> list[dict[str, int]]:
        out = []
        for url in self.judge_urls:
            try:
                out.append(httpx.get(f"{url}/stats", timeout=5).json())
            except httpx.HTTPError:
                out.append({})
        return out

    def down(self) -> None:
        """Stop whatever :meth:`up` started (also when it did not finish)."""
        self._stopping.set()
        with self._lock:
            for process in reversed(self.processes):
                process.stop()
        if hasattr(self, "redis"):
            self.redis.stop()
        if hasattr(self, "postgres"):
            self.postgres.stop("immediate")
            if self.postgres.logfile.exists():
                shutil.copy(self.postgres.logfile, self.workdir / "postgres.log")
        if self._pg_dir is not None:
            shutil.rmtree(self._pg_dir, ignore_errors=True)

    def self_restarts(self) -> dict[str, int]:
        """Processes that exited on their own (not killed by a fault) and were started again."""
        return {p.name: p.restarts for p in self.processes if p.restarts}
