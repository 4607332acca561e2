"""``drcredit audit``: start a judge audit on a running service, read its report, list
the audits (docs/audit.md). The service's tenant is the API key's, as everywhere.

Exit codes: 0 done; 2 bad input (an unknown judge, run, batch, group or audit; a bad
key); 3 the audit failed (its reason on one line); 4 the audit is not done (yet, or
within ``--wait``); 5 the service could not be reached or answered with a server error.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer

from drcredit.client import (
    AuditFailed,
    AuthError,
    BudgetExhausted,
    DrCreditClient,
    DrCreditConnectionError,
    DrCreditTimeout,
    InvalidRequest,
    NotFound,
    NotReady,
    ServerError,
)
from drcredit.client.errors import DrCreditError
from drcredit_cli.audit_table import headline, print_audit, print_audits
from drcredit_cli.consoles import err, fail, out
from drcredit_cli.flags import Command, Group

EXIT_AUDIT_FAILED = 3
EXIT_NOT_DONE = 4
EXIT_SERVICE = 5
EXIT_BUDGET = 6  # the tenant's budget is used up: a wait until its reset, not an outage

audit_app = typer.Typer(
    help=(
        "Judge audits on a running service: an audit judge the operator configured "
        "(DRCREDIT_AUDIT_JUDGES) re-scores a sample of done groups, and the report says how "
        "much the two judges agree and how far the advantages would move (docs/audit.md). "
        "Exit codes: 2 bad input, 3 the audit failed, 4 not done yet, 5 service unreachable."
    ),
    no_args_is_help=True,
    cls=Group,
)


Url = Annotated[
    str,
    typer.Option("--url", envvar="DRCREDIT_URL", help="The service's address."),
]
ApiKey = Annotated[
    str | None,
    typer.Option("--api-key", envvar="DRCREDIT_API_KEY", show_default=False, help="The tenant's API key."),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the service's JSON document instead of tables.")]
DEFAULT_URL = "http://127.0.0.1:8000"


@contextmanager
def service(url: str, api_key: str | None) -> Iterator[DrCreditClient]:
    """A client of the service; every error it raises becomes one line and an exit code."""
    try:
        with DrCreditClient(url, api_key=api_key or None, max_attempts=3) as client:
            yield client
    except InvalidRequest as exc:
        fail("; ".join(f"{e['field']}: {e['message']}" for e in exc.errors) or exc.message)
    except (NotFound, AuthError) as exc:
        fail(exc.message)
    except AuditFailed as exc:
        fail(exc.message, EXIT_AUDIT_FAILED)
    except NotReady as exc:
        if exc.status == "failed":
            fail(exc.message, EXIT_AUDIT_FAILED)
        fail(f"{exc.message}; not done yet (--wait S waits up to S seconds for its report)", EXIT_NOT_DONE)
    except DrCreditTimeout as exc:
        fail(exc.message, EXIT_NOT_DONE)
    except BudgetExhausted as exc:
        fail(f"{exc.message} (the tenant's {exc.budget} resets at {exc.resets_at})", EXIT_BUDGET)
    except DrCreditConnectionError as exc:
        fail(f"cannot reach the service: {exc} (--url, $DRCREDIT_URL)", EXIT_SERVICE)
    except ServerError as exc:
        fail(f"the service at {url} answered {exc}", EXIT_SERVICE)
    except DrCreditError as exc:
        fail(str(exc), EXIT_SERVICE)


def _print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


def _report(client: DrCreditClient, audit_id: str, wait: float | None, as_json: bool) -> None:
    """The audit's report: at once, or after waiting up to ``wait`` seconds (inf: until done)."""
    if wait is None:
        doc = client.get_audit(audit_id)
    else:
        doc = client.wait_for_audit(audit_id, timeout=None if math.isinf(wait) else wait)
    if as_json:
        _print_json(doc)
    else:
        print_audit(doc)


def _wait_option(help_text: str) -> Any:
    return typer.Option("--wait", min=0, metavar="S", show_default=False, help=help_text)


@audit_app.command("start", cls=Command)
def start(
    judge: Annotated[
        str,
        typer.Option(
            "--judge",
            help="The audit judge, by its name in DRCREDIT_AUDIT_JUDGES; 'human': compare with people's labels.",
        ),
    ],
    run: Annotated[str | None, typer.Option("--run", help="Audit the done groups of this training run.")] = None,
    batch: Annotated[str | None, typer.Option("--batch", help="Audit the done groups of this batch.")] = None,
    group: Annotated[
        list[str] | None, typer.Option("--group", help="Audit this group (repeat for several).", show_default=False)
    ] = None,
    sample: Annotated[
        int | None,
        typer.Option("--sample", min=1, help="How many of the scope's done groups to re-score (default: all)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the sample: the same seed, the same groups.")] = 0,
    labeler: Annotated[
        list[str] | None,
        typer.Option(
            "--labeler",
            help="With --judge human: only this labeler's labels (repeat; default: all).",
            show_default=False,
        ),
    ] = None,
    wait: Annotated[
        float | None,
        _wait_option("Wait up to S seconds for the report and print it (inf: until it is done)."),
    ] = None,
    as_json: AsJson = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Start an audit of a run, a batch or some groups; with --wait, print its report."""
    given = [flag for flag, value in (("--run", run), ("--batch", batch), ("--group", group)) if value]
    if len(given) != 1:
        fail(f"give exactly one of --run, --batch, --group (got {', '.join(given) or 'none'})")
    with service(url, api_key) as client:
        started = client.start_audit(
            judge,
            run=run,
            batch_id=batch,
            group_ids=group or None,
            sample_groups=sample,
            seed=seed,
            labelers=labeler or None,
        )
        audit_id = started["audit_id"]
        if wait is None and started["status"] == "done":  # against labels: done at once
            _report(client, audit_id, None, as_json)
            return
        if wait is None:
            if as_json:
                _print_json(started)
            else:
                out.print(headline(started), highlight=False)
                err.print(f"its report: drcredit audit show {audit_id} --wait 600", highlight=False)
            return
        if not as_json:
            err.print(headline(started) + "; waiting for its report", highlight=False)
        _report(client, audit_id, wait, as_json)


@audit_app.command("show", cls=Command)
def show(
    audit_id: Annotated[str, typer.Argument(metavar="AUDIT_ID", help="The audit, as start or list named it.")],
    wait: Annotated[
        float | None, _wait_option("Wait up to S seconds for the report if it is not done (inf: until it is).")
    ] = None,
    as_json: AsJson = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Print an audit's report: agreement per kind, confusion matrices, effect, usage."""
    with service(url, api_key) as client:
        _report(client, audit_id, wait, as_json)


@audit_app.command("list", cls=Command)
def list_(
    run: Annotated[str | None, typer.Option("--run", help="Only the audits over this run's groups.")] = None,
    as_json: AsJson = False,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """List this tenant's audits, newest first, with a done one's headline figures."""
    with service(url, api_key) as client:
        audits = client.list_audits(run=run)
    if as_json:
        _print_json({"audits": audits})
    else:
        print_audits(audits)
