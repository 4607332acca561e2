"""``drcredit``: score a group in-process, run the API, run a worker, migrate the database."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from sqlalchemy.exc import OperationalError

import drcredit
from drcredit.broker.queues import ALL_QUEUES
from drcredit.logs import configure_logging
from drcredit.process import raise_open_files_limit, tune_gc
from drcredit_cli.audit import audit_app
from drcredit_cli.consoles import err, fail
from drcredit_cli.flags import Command, Group
from drcredit_cli.labels import labels_app
from drcredit_cli.report import report as report_command
from drcredit_cli.score import score as score_command
from drcredit_cli.startup import build_runtime, database_unreachable, load_settings
from drcredit_cli.trial import trial as trial_command

app = typer.Typer(
    help=(
        "DrCredit: rubric-grounded process credit for deep-research agents.\n\n"
        "Judges how much new rubric support each search and visit turn of a rollout adds, "
        "normalizes the credits within a group of rollouts and returns per-turn advantages. "
        "Configuration comes from DRCREDIT_* environment variables (see the README)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)
db_app = typer.Typer(help="Database schema management (Alembic migrations).", no_args_is_help=True, cls=Group)
app.add_typer(db_app, name="db")
app.add_typer(audit_app, name="audit")
app.add_typer(labels_app, name="labels")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"drcredit {drcredit.__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """DrCredit: rubric-grounded process credit for deep-research agents."""


app.command("score", cls=Command)(score_command)


@app.command(cls=Command)
def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
) -> None:
    """Run the REST API (in-process execution and SQLite unless a broker and database are configured)."""
    import uvicorn

    from drcredit_api.app import create_app

    settings = load_settings()
    configure_logging(settings)
    # Fail here with one line, not in the server's start-up with a traceback.
    build_runtime(settings, check_only=True)
    api = create_app(settings)
    tune_gc(settings.gc_threshold)
    raise_open_files_limit()  # embedded mode: one socket per judge call in flight
    uvicorn.run(api, host=host, port=port, log_config=None, access_log=False)


def _worker_configs() -> dict[str, Any]:
    """Each worker service's settings (its ``config.py``), by queue, from the one list of services."""
    import importlib

    from drcredit.broker.queues import WORKER_SERVICES

    configs = [importlib.import_module(f"{s.package}.config").WORKER for s in WORKER_SERVICES]
    return {c.queue: c for c in configs}


@app.command(cls=Command)
def worker(
    queues: Annotated[
        str | None,
        typer.Option(
            help=f"Comma-separated queues to consume: {', '.join(ALL_QUEUES)} (default: all).",
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=(
                "Judge calls this worker keeps in flight and the Celery threads that deliver its tasks. "
                "Default: DRCREDIT_JUDGE_CONCURRENCY (1024) calls, and the largest thread setting of the "
                "chosen queues' services (512 with visit_judge)."
            ),
        ),
    ] = None,
) -> None:
    """Run a Celery worker for the named queues (needs DRCREDIT_BROKER_URL and a database)."""
    import importlib
    import os

    from drcredit.wiring import worker as worker_mod

    settings = load_settings()
    configure_logging(settings)
    if not settings.broker_url:
        fail("DRCREDIT_BROKER_URL is not set; a worker needs a broker (redis://...)")
    configs = _worker_configs()
    names = [q.strip() for q in (queues or ",".join(configs)).split(",") if q.strip()]
    unknown = [q for q in names if q not in configs]
    if unknown:
        fail(f"--queues: unknown queue(s) {', '.join(unknown)}; known: {', '.join(configs)}")
    chosen = [configs[q] for q in names]
    threads = concurrency or max(c.concurrency for c in chosen)
    raise_open_files_limit()  # one socket per judge call in flight
    try:
        celery_app, runtime = worker_mod.start(settings, concurrency or settings.judge_concurrency, names)
    except OperationalError as exc:
        database_unreachable(settings, exc)
    except ValueError as exc:
        fail(str(exc))
    if runtime.schema_problem:
        fail(runtime.schema_problem)
    for config in chosen:
        importlib.import_module(config.tasks_module)
    tune_gc(settings.gc_threshold)
    celery_app.worker_main(
        [
            "worker",
            "--queues",
            ",".join(names),
            "--concurrency",
            str(threads),
            "--pool",
            "threads",
            "--hostname",
            f"drcredit-{'-'.join(names)}-{os.getpid()}@%h",
            "--loglevel",
            settings.log_level.upper(),
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
    )


@db_app.command("upgrade", cls=Command)
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision.")] = "head") -> None:
    """Apply migrations up to REVISION (default: the latest) on DRCREDIT_DATABASE_URL."""
    from drcredit.storage.migrate import upgrade

    settings = load_settings()
    configure_logging(settings)
    try:
        upgrade(settings.resolved_database_url, revision)
    except OperationalError as exc:
        database_unreachable(settings, exc)
    err.print(f"database at revision {revision}")


app.command("report", cls=Command)(report_command)
app.command("trial", cls=Command)(trial_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
