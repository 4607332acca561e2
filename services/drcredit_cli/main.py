"""``drcredit``: score a group in-process, run the API, run a worker, migrate the database."""

from __future__ import annotations

import json
import logging
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

import drcredit
from drcredit.broker.queues import ALL_QUEUES
from drcredit.domain.errors import InvalidInput, errors_from_pydantic
from drcredit.domain.group import GroupIn
from drcredit.judges.breaker import BreakerState
from drcredit.logs import configure_logging
from drcredit.process import raise_open_files_limit, tune_gc
from drcredit.scoring.dispatch import InProcessDispatcher
from drcredit.scoring.errors import Conflict
from drcredit.scoring.results import documents
from drcredit.settings import Settings
from drcredit.storage import models as m
from drcredit.wiring.runtime import Runtime
from drcredit_cli.audit import audit_app
from drcredit_cli.consoles import err
from drcredit_cli.flags import Command, Group
from drcredit_cli.labels import labels_app
from drcredit_cli.report import report as report_command
from drcredit_cli.table import print_advantages
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


#: Exit codes of ``drcredit score`` (and the other commands' start-up checks).
EXIT_INPUT = 2  # bad input or configuration: one line says what to fix
EXIT_GROUP_FAILED = 3  # the group failed: the judge unreachable past the deadline, or policy fail
EXIT_JUDGMENTS_FAILED = 4  # scored, but some judgments failed (without --allow-failures)


def _fail(message: str, code: int = EXIT_INPUT) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code=code)


def _setting_problem(error: Any) -> str:
    """One validation error as ``DRCREDIT_NAME: what is wrong``: the setting named once
    (a validator's message usually names it already), without pydantic's "Value error, "."""
    message = str(error["msg"]).removeprefix("Value error, ")
    loc = "_".join(str(p) for p in error["loc"]).upper()
    name = f"DRCREDIT_{loc}" if loc else ""
    if not name or message.startswith(name):  # a model-level check names its own setting
        return message
    return f"{name}: {message}"


def _settings(**overrides: Any) -> Settings:
    """The environment's settings, or one line per mistake in it."""
    try:
        settings = Settings()
    except ValidationError as exc:
        _fail("invalid configuration: " + "; ".join(_setting_problem(e) for e in exc.errors()))
    except SettingsError as exc:  # a JSON setting (DRCREDIT_AUDIT_JUDGES, ...) that is not JSON
        field = re.search(r'field "(\w+)"', str(exc))
        name = f"DRCREDIT_{field.group(1).upper()}" if field else "a DRCREDIT_* setting"
        _fail(f"invalid configuration: {name}: not valid JSON ({exc.__cause__ or exc})")
    return settings.model_copy(update=overrides) if overrides else settings


def _database_unreachable(settings: Settings, exc: OperationalError) -> NoReturn:
    url = make_url(settings.resolved_database_url).render_as_string(hide_password=True)
    reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    _fail(f"cannot reach the database {url}: {reason} (check DRCREDIT_DATABASE_URL)")


def _runtime(settings: Settings, *, check_only: bool = False) -> Runtime | None:
    """Build the runtime (or only check what it needs), turning the usual start-up
    mistakes into one line each."""
    try:
        if check_only:
            Runtime.check(settings)
            return None
        return Runtime.build(settings)
    except OperationalError as exc:
        _database_unreachable(settings, exc)
    except ValueError as exc:  # judge settings, API keys
        _fail(str(exc))


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


def _load_group(path: Path, params_json: str | None) -> GroupIn:
    if path.is_dir():
        _fail(f"{path}: is a directory; give a JSON file holding one rollout group")
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        _fail(f"{path}: no such file")
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"{path}: cannot read it: {exc}")
    except json.JSONDecodeError as exc:
        _fail(f"{path}: invalid JSON: {exc}")
    if not isinstance(raw, dict):
        _fail(f"{path}: expected a JSON object (one rollout group), got {type(raw).__name__}")
    if params_json:
        try:
            overrides = json.loads(params_json)
        except json.JSONDecodeError as exc:
            _fail(f"--params: invalid JSON: {exc}")
        if not isinstance(overrides, dict):
            _fail("--params: expected a JSON object such as '{\"cap\": 0.75}'")
        raw["params"] = {**(raw.get("params") or {}), **overrides}
    try:
        return GroupIn.model_validate(raw)
    except ValidationError as exc:
        problems = errors_from_pydantic(exc.errors())
        _fail(f"{path}: invalid group:\n" + "\n".join(f"  {p}" for p in problems))
    raise AssertionError("unreachable")


@app.command(cls=Command)
def score(
    group_file: Annotated[
        Path, typer.Argument(metavar="GROUP.json", help="A rollout group as posted to POST /v1/groups.")
    ],
    params: Annotated[
        str | None, typer.Option("--params", help="JSON object of parameter overrides (docs/parameters.md).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the advantages document instead of a table.")] = False,
    store: Annotated[
        bool, typer.Option("--store", help="Keep the result in the configured database instead of a temporary one.")
    ] = False,
    allow_failures: Annotated[
        bool,
        typer.Option(
            "--allow-failures",
            help="Exit 0 even when judgments failed (they are scored as the failure policy says and flagged).",
        ),
    ] = False,
) -> None:
    """Score one group in this process (embedded database, no broker) and print its advantages.

    Exit codes: 0 scored; 2 bad input or configuration; 3 the group failed (the judge
    unreachable past DRCREDIT_JUDGE_OUTAGE_DEADLINE_S, or a failed judgment under policy
    fail); 4 scored but some judgments failed (0 with --allow-failures).
    """
    base = _settings()
    configure_logging(base, quiet=True)
    logging.getLogger("drcredit.outages").setLevel(logging.ERROR)  # said once, below
    group = _load_group(group_file, params)
    overrides: dict[str, Any] = {"broker_url": None}
    tmp = None
    if not store:
        tmp = tempfile.TemporaryDirectory(prefix="drcredit-score-")
        overrides.update(database_url=f"sqlite:///{Path(tmp.name) / 'score.sqlite3'}", auto_migrate=True)
    settings = base.model_copy(update=overrides)
    runtime = _runtime(settings)
    assert runtime is not None
    runtime.judge.breaker.add_listener(_say_judge_state)
    tune_gc(settings.gc_threshold)
    try:
        try:
            submitted = runtime.pipeline.submit_group("public", group)
        except Conflict as exc:
            _fail(str(exc))
        except InvalidInput as exc:
            _fail(str(exc))
        _follow(runtime, submitted.group_id)
        with runtime.db.session() as s:
            row = documents.find_group(s, "public", submitted.group_id, full=True)
            if row.status != "done":
                _fail(f"group {row.group_id} {row.status}: {row.error}", EXIT_GROUP_FAILED)
            document = documents.advantages_document(s, row, settings.judge_price)
            progress = documents.progress(s, row)
            reasons = _failure_reasons(s, row.id)
    finally:
        runtime.close()
        if tmp is not None:
            tmp.cleanup()
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        print_advantages(document, progress, judge=settings.judge)
    failed = progress["judgments_failed"]
    if failed and not allow_failures:
        _fail(
            f"{failed} judgment(s) failed; their turns are flagged unscorable and scored under policy "
            f"{document['params']['on_judge_failure']} (see the credits breakdown); --allow-failures accepts them"
            f"{reasons}",
            EXIT_JUDGMENTS_FAILED,
        )


def _failure_reasons(s: Any, group_pk: int) -> str:
    """Why judgments failed, by kind of failure with one example each (the temporary
    database, and with it the credits breakdown, is gone when the command ends)."""
    rows = s.execute(
        select(m.Judgment.failure_reason).where(m.Judgment.group_pk == group_pk, m.Judgment.status == "failed")
    ).scalars()
    examples: dict[str, tuple[int, str]] = {}
    for reason in rows:
        text = reason or "no reason recorded"
        kind = text.split(":", 1)[0].split(" after ", 1)[0]
        count, example = examples.get(kind, (0, text))
        examples[kind] = (count + 1, example)
    ranked = sorted(examples.items(), key=lambda item: -item[1][0])
    return "".join(f"\n  {count} x {example}" for _, (count, example) in ranked)


def _say_judge_state(state: BreakerState) -> None:
    if state.up:
        err.print(f"judge {state.endpoint} is reachable again; judging resumes", highlight=False)
    else:
        err.print(
            f"[yellow]judge {state.endpoint} unreachable ({state.reason}); waiting for it "
            f"(DRCREDIT_JUDGE_OUTAGE_DEADLINE_S)[/]",
            highlight=False,
        )


def _follow(runtime: Runtime, group_id: str) -> None:
    """Show judging progress on stderr until the group finishes."""
    dispatcher = runtime.dispatcher
    with Progress(
        TextColumn("[bold]judging[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(group_id, total=None)
        while True:
            with runtime.db.session() as s:
                row = documents.find_group(s, "public", group_id)
                p = documents.progress(s, row)
                status = row.status
            bar.update(task, total=max(p["judgments_total"], 1), completed=p["judgments_done"])
            if status in ("done", "failed"):
                break
            if isinstance(dispatcher, InProcessDispatcher):
                dispatcher.wait_idle(timeout=0.2)
            else:
                time.sleep(0.2)


@app.command(cls=Command)
def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
) -> None:
    """Run the REST API (in-process execution and SQLite unless a broker and database are configured)."""
    import uvicorn

    from drcredit_api.app import create_app

    settings = _settings()
    configure_logging(settings)
    # Fail here with one line, not in the server's start-up with a traceback.
    _runtime(settings, check_only=True)
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

    settings = _settings()
    configure_logging(settings)
    if not settings.broker_url:
        _fail("DRCREDIT_BROKER_URL is not set; a worker needs a broker (redis://...)")
    configs = _worker_configs()
    names = [q.strip() for q in (queues or ",".join(configs)).split(",") if q.strip()]
    unknown = [q for q in names if q not in configs]
    if unknown:
        _fail(f"--queues: unknown queue(s) {', '.join(unknown)}; known: {', '.join(configs)}")
    chosen = [configs[q] for q in names]
    threads = concurrency or max(c.concurrency for c in chosen)
    raise_open_files_limit()  # one socket per judge call in flight
    try:
        celery_app, runtime = worker_mod.start(settings, concurrency or settings.judge_concurrency, names)
    except OperationalError as exc:
        _database_unreachable(settings, exc)
    except ValueError as exc:
        _fail(str(exc))
    if runtime.schema_problem:
        _fail(runtime.schema_problem)
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

    settings = _settings()
    configure_logging(settings)
    try:
        upgrade(settings.resolved_database_url, revision)
    except OperationalError as exc:
        _database_unreachable(settings, exc)
    err.print(f"database at revision {revision}")


app.command("report", cls=Command)(report_command)
app.command("trial", cls=Command)(trial_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
