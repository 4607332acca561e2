"""The processes of ``drcredit trial`` and what they use: a database of their own on the
given Postgres, a Redis of their own (or an empty one given), the ingest API and one worker
per service of :data:`drcredit.broker.queues.SERVICES`, each worker serving its metrics on a
port of its own. Brought up in order and down in reverse; nothing of another deployment,
of the tests or of the benchmarks is touched.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import redis
from sqlalchemy.engine import make_url

from drcredit.broker.consumers import KEY as CONSUMERS_KEY
from drcredit.broker.queues import ALL_QUEUES, AUDITOR, SERVICES, Service
from drcredit.storage.migrate import upgrade
from drcredit_cli.consoles import err

#: Judge calls in flight and Celery threads of each worker: plenty for the examples on a
#: laptop (a deployment's defaults are sized for a training step). Not the auditor's: its
#: threads are audits at once, and --concurrency would cap its judge calls at them.
CONCURRENCY = 16
#: The audit judge of a trial whose environment names none: ``drcredit audit start --judge
#: offline`` re-scores with the offline judge (agreeing fully with an offline trial).
TRIAL_AUDIT_JUDGES = '{"offline": {"judge": "offline"}}'


def own_audit_judges() -> str | None:
    """The audit judges this environment configures, if any (else the trial's own)."""
    return os.environ.get("DRCREDIT_AUDIT_JUDGES") or None


#: Celery's bookkeeping in Redis, besides the queues and their ``_kombu.binding*`` keys.
KOMBU_KEYS = ("unacked", "unacked_index", "unacked_mutex")


class TrialError(Exception):
    """Something the user can fix; said in one line."""


@dataclass
class Process:
    service: Service
    popen: subprocess.Popen[bytes]
    log: Path
    metrics_url: str


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        # As the servers bind: a port whose last connections linger in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _admin_url(postgres: str) -> str:
    """The server's URL for psycopg (a SQLAlchemy ``+psycopg`` URL is accepted too)."""
    return postgres.replace("postgresql+psycopg://", "postgresql://", 1)


def _create_database(postgres: str) -> tuple[str, str]:
    """A new empty database on the server: (its name, its SQLAlchemy URL)."""
    name = f"drcredit_trial_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(_admin_url(postgres), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrialError(f"cannot create a database on {postgres}: {first} (--postgres)") from exc
    url = make_url(_admin_url(postgres)).set(drivername="postgresql+psycopg", database=name)
    return name, url.render_as_string(hide_password=False)


def _drop_database(postgres: str, name: str) -> None:
    with psycopg.connect(_admin_url(postgres), autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _check_empty(url: str) -> None:
    """A Redis database given to the trial must hold nothing: another deployment's queues
    would hand the trial's workers messages about another database."""
    client: Any = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        keys = int(client.dbsize())
    except redis.RedisError as exc:
        raise TrialError(f"cannot use Redis at {url}: {exc} (--redis)") from exc
    finally:
        client.close()
    if keys:
        raise TrialError(f"{url} holds {keys} keys; give the trial an empty Redis database, or no --redis")


def _clear_broker(url: str) -> None:
    """Remove what the trial's processes wrote: the queues, Celery's bookkeeping and the
    DrCredit keys (the workers' records, the judge fleet's state)."""
    client: Any = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        ours = [*ALL_QUEUES, *KOMBU_KEYS, CONSUMERS_KEY]
        ours += [k.decode() for pattern in ("_kombu.binding*", "drcredit:*") for k in client.scan_iter(match=pattern)]
        client.delete(*ours)
    except redis.RedisError as exc:
        err.print(f"[yellow]could not clean up Redis at {url}: {exc}[/]", highlight=False)
    finally:
        client.close()


class PrivateRedis:
    """A ``redis-server`` of the trial's own on a free port, without persistence: nothing
    of another deployment (or of the tests, or the benchmarks) shares its queues."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> str:
        binary = shutil.which("redis-server")
        if binary is None:
            raise TrialError(
                "redis-server not found: install Redis (e.g. apt-get install redis-server) or give --redis"
            )
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        command = [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
        with (self.workdir / "redis.log").open("wb") as sink:
            self.process = subprocess.Popen(
                [*command, "--dir", str(self.workdir)], stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.url = f"redis://127.0.0.1:{port}/0"
        client: Any = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return self.url
            except redis.ConnectionError as exc:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise TrialError(f"redis-server did not start; see {self.workdir / 'redis.log'}") from exc
                time.sleep(0.05)
            finally:
                client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


def _environment(database_url: str, broker_url: str, judge: str) -> dict[str, str]:
    """The processes' environment: this one without its DrCredit settings (a trial is
    open and self-contained), the judge's kept with ``--judge env``, the audit judges
    kept when set (else the offline one, :data:`TRIAL_AUDIT_JUDGES`)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DRCREDIT_") or (judge == "env" and k.startswith("DRCREDIT_JUDGE"))
    }
    env.update(DRCREDIT_DATABASE_URL=database_url, DRCREDIT_BROKER_URL=broker_url)
    env["DRCREDIT_AUDIT_JUDGES"] = own_audit_judges() or TRIAL_AUDIT_JUDGES
    if judge == "offline":
        env["DRCREDIT_JUDGE"] = "offline"
    return env


def _start(service: Service, env: dict[str, str], logs: Path, api_port: int, metrics_port: int) -> Process:
    command = [sys.executable, "-m", "drcredit_cli.main"]
    if service.queue is None:
        command += ["serve", "--host", "127.0.0.1", "--port", str(api_port)]
        metrics = f"http://127.0.0.1:{api_port}/metrics"
    else:
        command += ["worker", "--queues", service.queue]
        if service.queue != AUDITOR:
            command += ["--concurrency", str(CONCURRENCY)]
        env = {**env, "DRCREDIT_METRICS_PORT": str(metrics_port)}
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    log = logs / f"{service.compose_name}.log"
    with log.open("wb") as sink:
        # A session of its own: Ctrl-C reaches the trial, which stops the processes in order.
        popen = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    return Process(service, popen, log, metrics)


def _stop(processes: list[Process], grace_s: float = 30.0) -> None:
    """SIGTERM to each process (workers hand their work back), SIGKILL past the grace."""
    for process in processes:
        if process.popen.poll() is None:
            process.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.popen.kill()
            process.popen.wait(10)


class Stack:
    """The trial's processes and what they use: up in order, down in reverse."""

    def __init__(self, postgres: str, redis_url: str | None, judge: str, logs: Path, port: int, metrics_port: int):
        self.postgres, self.given_redis, self.judge, self.logs = postgres, redis_url, judge, logs
        self.port = port
        self.worker_ports = [metrics_port + i for i in range(len(SERVICES) - 1)]
        self.processes: list[Process] = []
        self.database: str | None = None
        self.database_url: str | None = None
        self.redis: PrivateRedis | None = None
        self.broker_url: str | None = None

    def up(self) -> None:
        busy = [p for p in (self.port, *self.worker_ports) if not _port_free(p)]
        if busy:
            raise TrialError(f"port(s) {', '.join(map(str, busy))} in use (--port, --metrics-port)")
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.given_redis is not None:
            _check_empty(self.given_redis)
            self.broker_url = self.given_redis
        else:
            self.redis = PrivateRedis(self.logs)
            self.broker_url = self.redis.start()
        self.database, self.database_url = _create_database(self.postgres)
        upgrade(self.database_url)
        env = _environment(self.database_url, self.broker_url, self.judge)
        ports = iter(self.worker_ports)
        for service in SERVICES:
            metrics_port = 0 if service.queue is None else next(ports)
            self.processes.append(_start(service, env, self.logs, self.port, metrics_port))

    def settings(self) -> dict[str, str]:
        """The settings the trial's processes share (its judge's, with ``--judge env``, come
        from the environment)."""
        values = {"DRCREDIT_DATABASE_URL": self.database_url or "", "DRCREDIT_BROKER_URL": self.broker_url or ""}
        if self.judge == "offline":
            values["DRCREDIT_JUDGE"] = "offline"
        if own_audit_judges() is None:
            values["DRCREDIT_AUDIT_JUDGES"] = TRIAL_AUDIT_JUDGES
        return values

    def down(self, keep: bool) -> None:
        if self.processes:
            err.print("stopping every process (workers hand back their work first) ...", highlight=False)
        _stop(self.processes)
        if self.redis is not None:
            self.redis.stop()
        elif self.broker_url is not None:
            _clear_broker(self.broker_url)
        if self.database is None:
            return
        if keep:
            err.print(f"every process stopped; database {self.database} kept", highlight=False)
            return
        _drop_database(self.postgres, self.database)
        err.print(f"every process stopped; database {self.database} dropped", highlight=False)
