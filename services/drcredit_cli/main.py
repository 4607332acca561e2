"""``drcredit``: score a group in-process, run the API, run a worker, migrate the database."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from drcredit.domain.errors import InvalidInput, errors_from_pydantic
from drcredit.domain.group import GroupIn
from drcredit.logs import configure_logging
from drcredit.process import tune_gc
from drcredit.scoring import documents
from drcredit.scoring.dispatch import InProcessDispatcher
from drcredit.scoring.errors import Conflict
from drcredit.scoring.runtime import Runtime
from drcredit.settings import Settings

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
)
db_app = typer.Typer(help="Database schema management (Alembic migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")

err = Console(stderr=True)


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code=2)


def _load_group(path: Path, params_json: str | None) -> GroupIn:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        _fail(f"{path}: no such file")
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


@app.command()
def score(
    group_file: Annotated[
        Path, typer.Argument(metavar="GROUP.json", help="A rollout group as posted to POST /v1/groups.")
    ],
    params: Annotated[
        str | None, typer.Option("--params", help="JSON object of parameter overrides (SPEC section 7).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the advantages document instead of a table.")] = False,
    store: Annotated[
        bool, typer.Option("--store", help="Keep the result in the configured database instead of a temporary one.")
    ] = False,
) -> None:
    """Score one group in this process (embedded database, no broker) and print its advantages."""
    configure_logging(Settings(), quiet=True)
    group = _load_group(group_file, params)
    overrides: dict[str, Any] = {"broker_url": None}
    tmp = None
    if not store:
        tmp = tempfile.TemporaryDirectory(prefix="drcredit-score-")
        overrides.update(database_url=f"sqlite:///{Path(tmp.name) / 'score.sqlite3'}", auto_migrate=True)
    settings = Settings().model_copy(update=overrides)
    runtime = Runtime.build(settings)
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
                _fail(f"group {row.group_id} {row.status}: {row.error}")
            document = documents.advantages_document(s, row)
            progress = documents.progress(s, row)
    finally:
        runtime.close()
        if tmp is not None:
            tmp.cleanup()
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        _print_table(document, progress)


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


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:+.4f}"


def _print_table(document: dict[str, Any], progress: dict[str, int]) -> None:
    out = Console()
    stats = document["stats"]
    table = Table(title=f"Advantages of group {document['group_id']}", show_lines=False)
    for column in ("rollout", "turn", "type", "credit", "process adv.", "advantage"):
        table.add_column(column, justify="right" if column not in ("rollout", "type") else "left")
    for rollout in document["rollouts"]:
        first = True
        for turn in rollout["turns"]:
            label = f"{rollout['id']} (A_o {_fmt(rollout['outcome_advantage'])})" if first else ""
            credit = "" if turn["credit"] is None else f"{turn['credit']:.3f}"
            table.add_row(
                label,
                str(turn["index"]),
                turn["type"],
                credit,
                _fmt(turn["process_advantage"]),
                _fmt(turn["advantage"]),
            )
            first = False
        table.add_section()
    out.print(table)
    sigma_o = stats["sigma_o"]
    out.print(
        f"mu_rg={stats['mu_rg']:.4f} sigma_rg={stats['sigma_rg']:.4f} "
        f"mu_o={'n/a' if stats['mu_o'] is None else format(stats['mu_o'], '.4f')} "
        f"sigma_o={'n/a' if sigma_o is None else format(sigma_o, '.4f')}  |  "
        f"judge calls {progress['judge_calls']}, cache hits {progress['cache_hits']}, "
        f"deterministic zeros {progress['deterministic_zeros']}, skipped snippet calls {progress['snippet_calls_skipped']}, "
        f"failed {progress['judgments_failed']}",
        highlight=False,
    )


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
) -> None:
    """Run the REST API (in-process execution and SQLite unless a broker and database are configured)."""
    import uvicorn

    from drcredit_api.app import create_app

    settings = Settings()
    configure_logging(settings)
    api = create_app(settings)
    tune_gc(settings.gc_threshold)
    uvicorn.run(api, host=host, port=port, log_config=None, access_log=False)


def _worker_configs() -> dict[str, Any]:
    from drcredit_aggregator.config import WORKER as AGGREGATOR
    from drcredit_snippet_matcher.config import WORKER as SNIPPETS
    from drcredit_visit_judge.config import WORKER as VISITS

    return {c.queue: c for c in (VISITS, SNIPPETS, AGGREGATOR)}


@app.command()
def worker(
    queues: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated queues to consume: visit_judge, snippet_matcher, credit_aggregator (default: all)."
        ),
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help="Tasks run at once (threads); default: the services' own setting.")
    ] = None,
) -> None:
    """Run a Celery worker for the named queues (needs DRCREDIT_BROKER_URL and a database)."""
    import importlib
    import os

    from drcredit.broker import worker as worker_mod

    settings = Settings()
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
    celery_app, _ = worker_mod.start(settings, threads)
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


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision.")] = "head") -> None:
    """Apply migrations up to REVISION (default: the latest) on DRCREDIT_DATABASE_URL."""
    from drcredit.storage.migrate import upgrade

    settings = Settings()
    configure_logging(settings)
    upgrade(settings.resolved_database_url, revision)
    err.print(f"database at revision {revision}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
