"""``drcredit score``: one group scored in this process (an embedded database, no
broker), its advantages printed, and an exit code that says how it went."""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import select

from drcredit.domain.errors import InvalidInput, errors_from_pydantic
from drcredit.domain.group import GroupIn
from drcredit.judges.breaker import BreakerState
from drcredit.logs import configure_logging
from drcredit.process import tune_gc
from drcredit.scoring.dispatch import InProcessDispatcher
from drcredit.scoring.errors import Conflict
from drcredit.scoring.results import documents
from drcredit.storage import models as m
from drcredit.wiring.runtime import Runtime
from drcredit_cli.consoles import err, fail
from drcredit_cli.startup import build_runtime, load_settings
from drcredit_cli.table import print_advantages

#: Exit codes beyond a bad input or configuration (2).
EXIT_GROUP_FAILED = 3  # the group failed: the judge unreachable past the deadline, or policy fail
EXIT_JUDGMENTS_FAILED = 4  # scored, but some judgments failed (without --allow-failures)


def _load_group(path: Path, params_json: str | None) -> GroupIn:
    if path.is_dir():
        fail(f"{path}: is a directory; give a JSON file holding one rollout group")
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        fail(f"{path}: no such file")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"{path}: cannot read it: {exc}")
    except json.JSONDecodeError as exc:
        fail(f"{path}: invalid JSON: {exc}")
    if not isinstance(raw, dict):
        fail(f"{path}: expected a JSON object (one rollout group), got {type(raw).__name__}")
    if params_json:
        try:
            overrides = json.loads(params_json)
        except json.JSONDecodeError as exc:
            fail(f"--params: invalid JSON: {exc}")
        if not isinstance(overrides, dict):
            fail("--params: expected a JSON object such as '{\"cap\": 0.75}'")
        raw["params"] = {**(raw.get("params") or {}), **overrides}
    try:
        return GroupIn.model_validate(raw)
    except ValidationError as exc:
        problems = errors_from_pydantic(exc.errors())
        fail(f"{path}: invalid group:\n" + "\n".join(f"  {p}" for p in problems))
    raise AssertionError("unreachable")


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
    base = load_settings()
    configure_logging(base, quiet=True)
    logging.getLogger("drcredit.outages").setLevel(logging.ERROR)  # said once, below
    group = _load_group(group_file, params)
    overrides: dict[str, Any] = {"broker_url": None}
    tmp = None
    if not store:
        tmp = tempfile.TemporaryDirectory(prefix="drcredit-score-")
        overrides.update(database_url=f"sqlite:///{Path(tmp.name) / 'score.sqlite3'}", auto_migrate=True)
    settings = base.model_copy(update=overrides)
    runtime = build_runtime(settings)
    assert runtime is not None
    runtime.judge.breaker.add_listener(_say_judge_state)
    tune_gc(settings.gc_threshold)
    try:
        try:
            submitted = runtime.pipeline.submit_group("public", group)
        except Conflict as exc:
            fail(str(exc))
        except InvalidInput as exc:
            fail(str(exc))
        _follow(runtime, submitted.group_id)
        with runtime.db.session() as s:
            row = documents.find_group(s, "public", submitted.group_id, full=True)
            if row.status != "done":
                fail(f"group {row.group_id} {row.status}: {row.error}", EXIT_GROUP_FAILED)
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
        fail(
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
