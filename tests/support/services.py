"""Private Redis and Postgres servers that a test may stop and restart, and worker processes.

The shared servers on 6379 and 5432 are left alone; tests that restart a server get their
own instance on a free port in a temporary directory.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import redis

from tests.support.live import free_port


class PrivateRedis:
    """``appendonly``: keep the queues across a restart in an append-only file, as the
    compose stack's Redis does (written every second: a crash loses the last second)."""

    def __init__(self, workdir: Path, *, appendonly: bool = False):
        self.port = free_port()
        self.workdir = workdir
        self.appendonly = appendonly
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "yes" if self.appendonly else "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


@contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    with tempfile.TemporaryDirectory() as tmp:
        server = PrivateRedis(Path(tmp))
        server.start()
        try:
            yield server
        finally:
            server.stop()


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} not found")
    return path


class PrivatePostgres:
    """A throwaway cluster run as the postgres user (the server refuses to run as root)."""

    def __init__(self, workdir: Path):
        self.port = free_port()
        self.datadir = workdir / "data"
        self.logfile = workdir / "postgres.log"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        workdir.chmod(0o777)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def init(self) -> None:
        subprocess.run(
            [*self._as, _pg_bin("initdb"), "-D", str(self.datadir), "-U", "postgres", "-A", "trust"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def start(self) -> None:
        subprocess.run(
            [
                *self._as,
                _pg_bin("pg_ctl"),
                "-D",
                str(self.datadir),
                "-l",
                str(self.logfile),
                "-w",
                "-t",
                "30",
                "-o",
                f"-p {self.port} -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off",
                "start",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            [*self._as, _pg_bin("pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop"],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 20
        while True:
            try:
                with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres", connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    with tempfile.TemporaryDirectory() as tmp:
        server = PrivatePostgres(Path(tmp))
        server.init()
        server.start()
        server.wait_ready()
        try:
            yield server
        finally:
            server.stop("immediate")


class Workers:
    """``drcredit worker`` subprocesses with a shared environment.

    With ``supervise`` a worker that exits on its own is started again, as the restart
    policy of docker compose or a Kubernetes Deployment does: Celery ends a worker whose
    broker connection fails in a way it cannot recover from, and relies on that.
    """

    def __init__(self, env: dict[str, str], logdir: Path, *, supervise: bool = False):
        self.env = env
        self.logdir = logdir
        self.processes: list[subprocess.Popen[bytes]] = []
        self.restarts = 0
        self._specs: dict[int, tuple[str, int | None]] = {}
        self._stopping = threading.Event()
        if supervise:
            threading.Thread(target=self._supervise, daemon=True).start()

    def start(self, queues: str, concurrency: int | None = 4, *, wait: bool = True) -> subprocess.Popen[bytes]:
        """``concurrency`` None: the worker's defaults (its services' threads, and
        DRCREDIT_JUDGE_CONCURRENCY judge calls)."""
        log = open(self.logdir / f"worker-{queues}-{len(self.processes)}.log", "wb")  # noqa: SIM115
        cli = [sys.executable, "-m", "drcredit_cli.main", "worker", "--queues", queues]
        if concurrency is not None:
            cli += ["--concurrency", str(concurrency)]
        process = subprocess.Popen(cli, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(process)
        self._specs[process.pid] = (queues, concurrency)
        if wait:
            self._wait_ready(Path(log.name), process)
        return process

    def _supervise(self) -> None:
        while not self._stopping.wait(0.5):
            for process in list(self.processes):
                spec = self._specs.get(process.pid)
                if spec is not None and process.poll() is not None and not self._stopping.is_set():
                    del self._specs[process.pid]
                    self.restarts += 1
                    self.start(*spec, wait=False)

    def _wait_ready(self, log: Path, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 60
        while b" ready." not in log.read_bytes():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)

    def stop_all(self) -> None:
        self._stopping.set()
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
        for process in self.processes:
            process.wait(20)

    def logs(self) -> str:
        return "\n".join(p.read_text()[-4000:] for p in sorted(self.logdir.glob("worker-*.log")))
