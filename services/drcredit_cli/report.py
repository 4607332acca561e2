"""``drcredit report``: one group or one run as a self-contained HTML file for sharing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import httpx
import typer
from pydantic import ValidationError
from sqlalchemy import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError

from drcredit.scoring.errors import NotFound, NotReady
from drcredit.settings import Settings
from drcredit_cli.consoles import err, fail

if TYPE_CHECKING:
    from drcredit_api.ui.report import Fetch


def report(
    kind: Annotated[str, typer.Argument(help="What to show: group or run.", metavar="group|run")],
    name: Annotated[str, typer.Argument(help="The group id or the run name.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")] = Path("report.html"),
    url: Annotated[
        str | None,
        typer.Option(help="Read from this service (key: $DRCREDIT_API_KEY) instead of the database."),
    ] = None,
    tenant: Annotated[str, typer.Option(help="Tenant whose data to read from the database.")] = "public",
) -> None:
    """Write the viewer's page of a GROUP or a RUN as one HTML file (charts included)."""
    from drcredit_api.ui.report import database_fetch, remote_fetch

    if kind not in ("group", "run"):
        fail(f"KIND must be group or run, got {kind!r}")
    try:
        if url:
            key = os.environ.get("DRCREDIT_API_KEY")
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=120) as client:
                html = _html(kind, name, remote_fetch(client))
        else:
            from drcredit.storage.database import Database

            settings = Settings()
            _check_database(settings.resolved_database_url)
            db = Database(settings.resolved_database_url, 2)
            try:
                html = _html(
                    kind, name, database_fetch(db, tenant, kind, name, settings.judge_price, settings.drift_threshold)
                )
            finally:
                db.dispose()
    except (LookupError, NotFound, NotReady, ValidationError) as exc:
        fail(str(exc))
    except (OperationalError, ProgrammingError) as exc:
        first = str(exc).splitlines()[0]
        if "no such table" in first or "UndefinedTable" in first:
            fail(f"the database {_shown(Settings().resolved_database_url)} has no DrCredit tables: {WHERE_FROM}", 3)
        fail(f"cannot read the {kind}: {first}", 3)
    except httpx.HTTPError as exc:
        fail(f"cannot read the {kind}: {str(exc).splitlines()[0]}", 3)
    output.write_text(html)
    err.print(f"wrote {output} ({len(html) // 1024} KiB)")


WHERE_FROM = (
    "point DRCREDIT_DATABASE_URL at the service's database, or read a running service with --url"
    " (scripts/demo and drcredit score keep nothing)"
)


def _shown(database_url: str) -> str:
    return make_url(database_url).render_as_string(hide_password=True)


def _check_database(database_url: str) -> None:
    """Refuse a SQLite file that is not there, rather than create an empty one and fail on it."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).exists():
        fail(f"no database at {url.database}: {WHERE_FROM}", 3)


def _html(kind: str, name: str, fetch: Fetch) -> str:
    """The page; an unknown run is refused first, naming the runs there are."""
    from drcredit_api.ui.report import missing_run, report_html

    if kind == "run":
        problem = missing_run(name, fetch)
        if problem is not None:
            fail(problem)
    return report_html(kind, name, fetch)
