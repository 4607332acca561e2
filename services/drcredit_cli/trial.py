"""``drcredit trial``: the distributed stack on one machine, to try it out.

What a deployment runs, started as local processes on the Postgres and Redis the tests
use: a fresh database, the ingest API and one worker per service of the one list of
services (:data:`drcredit.broker.queues.SERVICES`), each worker serving its metrics on a
port of its own. It posts the example groups, prints their advantages and where to look
(viewer, readiness, every process's metrics, logs), and on Ctrl-C stops every process
and drops the database. The judge is the offline one unless ``--judge env``: numbers
without a GPU, the same as ``drcredit score`` gives in-process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import psycopg
import redis
import typer
from rich.console import Console
from sqlalchemy.engine import make_url

from drcredit.broker.consumers import KEY as CONSUMERS_KEY
from drcredit.broker.consumers import ConsumerRegistry
from drcredit.broker.queues import ALL_QUEUES, SERVICES, Service
from drcredit.client import DrCreditClient
from drcredit.client.errors import DrCreditError
from drcredit.storage.migrate import upgrade
from drcredit_cli.table import print_advantages

out = Console()
err = Console(stderr=True)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: Judge calls in flight and Celery threads of each worker: plenty for the examples on a
#: laptop (a deployment's defaults are sized for a training step).
CONCURRENCY = 16
#: The keys of one deployment in its Redis database: Celery's queues and bookkeeping and
#: the workers' records. A trial empties them at start and at exit.
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


def _clear_broker(url: str, *, refuse_if_used: bool) -> None:
    """Empty the deployment keys of the trial's Redis database; refuse one that live
    workers use (another deployment's, which a trial must not take messages from)."""
    client: Any = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        if refuse_if_used:
            live = ConsumerRegistry(url).census().live()
            if live:
                names = ", ".join(c.worker for c in live)
                raise TrialError(f"{url} is in use by live workers ({names}); give the trial another --redis database")
        stale = [*ALL_QUEUES, *KOMBU_KEYS, CONSUMERS_KEY]
        stale += [k.decode() for k in client.scan_iter(match="_kombu.binding.*")]
        stale += [k.decode() for k in client.scan_iter(match="drcredit:*")]
        client.delete(*stale)
    except redis.RedisError as exc:
        raise TrialError(f"cannot use Redis at {url}: {exc} (--redis)") from exc
    finally:
        client.close()


def _environment(database_url: str, broker_url: str, judge: str) -> dict[str, str]:
    """The processes' environment: this one without its DrCredit settings (a trial is
    open and self-contained), the judge's kept with ``--judge env``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DRCREDIT_") or (judge == "env" and k.startswith("DRCREDIT_JUDGE"))
    }
    env.update(DRCREDIT_DATABASE_URL=database_url, DRCREDIT_BROKER_URL=broker_url)
    if judge == "offline":
        env["DRCREDIT_JUDGE"] = "offline"
    return env


def _start(service: Service, env: dict[str, str], logs: Path, api_port: int, metrics_port: int) -> Process:
    command = [sys.executable, "-m", "drcredit_cli.main"]
    if service.queue is None:
        command += ["serve", "--host", "127.0.0.1", "--port", str(api_port)]
        metrics = f"http://127.0.0.1:{api_port}/metrics"
    else:
        command += ["worker", "--queues", service.queue, "--concurrency", str(CONCURRENCY)]
        env = {**env, "DRCREDIT_METRICS_PORT": str(metrics_port)}
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    log = logs / f"{service.compose_name}.log"
    with log.open("wb") as sink:
        # A session of its own: Ctrl-C reaches the trial, which stops the processes in order.
        popen = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    return Process(service, popen, log, metrics)


def _tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _exited(processes: list[Process]) -> list[Process]:
    return [p for p in processes if p.popen.poll() is not None]


def _wait_ready(client: DrCreditClient, processes: list[Process], timeout: float = 120.0) -> dict[str, Any]:
    """Until /readyz is ready and every queue has a live consumer."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        for process in _exited(processes):
            raise TrialError(
                f"the {process.service.name} exited with code {process.popen.returncode}; "
                f"the end of {process.log}:\n{_tail(process.log)}"
            )
        try:
            last = client.readyz()
            if last.get("status") == "ready" and last.get("queues", {}).get("without_consumer") == []:
                ready: dict[str, Any] = last
                return ready
        except Exception as exc:  # noqa: BLE001 - not up yet
            last = exc
        time.sleep(0.3)
    raise TrialError(f"the stack was not ready after {timeout:.0f}s; last /readyz: {last}")


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


def _score_examples(client: DrCreditClient, files: list[Path]) -> list[str]:
    group_ids = []
    for path in files:
        accepted = client.submit_group(_load(path))
        group_ids.append(str(accepted["group_id"]))
    for group_id in group_ids:
        document = client.wait_for_advantages(group_id, timeout=300)
        print_advantages(document, document["progress"], out)
        out.print()
    return group_ids


def _load(path: Path) -> dict[str, Any]:
    import json

    try:
        loaded: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TrialError(f"{path}: {exc}") from exc
    return loaded


def _summary(base: str, processes: list[Process], group_ids: list[str], logs: Path, database: str, keep: bool) -> None:
    width = max(len(p.service.name) for p in processes)

    def say(text: str) -> None:
        out.print(text, highlight=False, soft_wrap=True)  # a URL stays on one line

    say("[bold]The distributed stack is running on this machine.[/]")
    say(f"  viewer     {base}/ui")
    for group_id in group_ids:
        say(f"             {base}/ui/groups/{group_id}")
    say(f"  API        {base}/docs (OpenAPI), {base}/readyz (readiness)")
    say("  metrics    each process its own (judge calls, group latency: the workers')")
    for process in processes:
        say(f"             {process.service.name:<{width}}  {process.metrics_url}")
    say(f"  logs       {logs}/")
    say(f"  database   {database} ({'kept' if keep else 'dropped'} when the trial stops)")


def _watch(processes: list[Process]) -> None:
    """Until Ctrl-C (or SIGTERM); a process that exits meanwhile is said once."""
    said: set[int] = set()
    while True:
        for process in _exited(processes):
            if process.popen.pid not in said:
                said.add(process.popen.pid)
                err.print(
                    f"[yellow]the {process.service.name} exited (code {process.popen.returncode}); "
                    f"/readyz now lists its queue without a consumer. Log: {process.log}[/]",
                    highlight=False,
                )
        time.sleep(0.5)


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def trial(
    groups: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="[GROUP.json]...",
            help="Groups to score (default: examples/group.json and examples/group_judged.json).",
        ),
    ] = None,
    postgres: Annotated[
        str, typer.Option(help="A Postgres server on which to create the trial's database (dropped at exit).")
    ] = "postgresql://postgres@127.0.0.1:5432/postgres",
    redis_url: Annotated[
        str,
        typer.Option("--redis", help="A Redis database for the trial's queues; its DrCredit keys are emptied."),
    ] = "redis://127.0.0.1:6379/15",
    port: Annotated[int, typer.Option(help="The API's port.")] = 8000,
    metrics_port: Annotated[
        int, typer.Option(help="The first worker's metrics port; the others take the next ones.")
    ] = 9101,
    judge: Annotated[
        str,
        typer.Option(help="offline (deterministic, no GPU) or env (the DRCREDIT_JUDGE* settings of this environment)."),
    ] = "offline",
    logs: Annotated[Path, typer.Option(help="Where each process writes its log.")] = Path(".drcredit/trial-logs"),
    keep: Annotated[bool, typer.Option("--keep", help="Keep the trial's database at exit.")] = False,
    exit_when_scored: Annotated[
        bool, typer.Option("--exit", help="Stop once the groups are scored instead of waiting for Ctrl-C.")
    ] = False,
) -> None:
    """Run the distributed stack on this machine: API and one worker per service.

    Creates a fresh database on --postgres, starts the ingest API and a worker for each
    queue (each serving its metrics on a port of its own), scores the groups, prints
    their advantages and where to look (viewer, readiness, metrics, logs), and waits;
    Ctrl-C stops every process and drops the database.
    """
    if judge not in ("offline", "env"):
        err.print(f"[bold red]error:[/] --judge: expected offline or env, got {judge!r}", highlight=False)
        raise typer.Exit(2)
    files = groups or [EXAMPLES / "group.json", EXAMPLES / "group_judged.json"]
    services = list(SERVICES)
    worker_ports = [metrics_port + i for i in range(len(services) - 1)]
    signal.signal(signal.SIGTERM, _interrupt)
    processes: list[Process] = []
    database: str | None = None
    code = 0
    try:
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise TrialError(f"no such file: {', '.join(missing)}")
        busy = [p for p in (port, *worker_ports) if not _port_free(p)]
        if busy:
            raise TrialError(f"port(s) {', '.join(map(str, busy))} in use (--port, --metrics-port)")
        _clear_broker(redis_url, refuse_if_used=True)
        database, database_url = _create_database(postgres)
        upgrade(database_url)
        logs.mkdir(parents=True, exist_ok=True)
        env = _environment(database_url, redis_url, judge)
        ports = iter(worker_ports)
        for service in services:
            processes.append(_start(service, env, logs, port, 0 if service.queue is None else next(ports)))
        base = f"http://127.0.0.1:{port}"
        with DrCreditClient(base, timeout=30) as client:
            err.print(f"starting the API and {len(services) - 1} workers (logs in {logs}/) ...", highlight=False)
            _wait_ready(client, processes)
            group_ids = _score_examples(client, files)
        _summary(base, processes, group_ids, logs, database, keep)
        if not exit_when_scored:
            out.print("Ctrl-C stops every process.", highlight=False)
            _watch(processes)
    except KeyboardInterrupt:
        pass
    except (TrialError, DrCreditError) as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        code = 2
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave processes behind
        if processes:
            err.print("stopping every process (workers hand back their work first) ...", highlight=False)
        _stop(processes)
        if database is not None and not keep:
            _drop_database(postgres, database)
        if database is not None:
            try:
                _clear_broker(redis_url, refuse_if_used=False)
            except TrialError as exc:
                err.print(f"[yellow]{exc}[/]", highlight=False)
        err.print(
            "every process stopped" + ("" if keep or database is None else f"; database {database} dropped"),
            highlight=False,
        )
    raise typer.Exit(code)
