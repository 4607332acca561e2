"""``drcredit trial``: the distributed stack on one machine, to try it out.

What a deployment runs, started as local processes (:mod:`drcredit_cli.trial_stack`): a
fresh database on the local Postgres, a Redis of its own, the ingest API and one worker per
service, each worker serving its metrics on a port of its own. It posts the example
groups, prints their advantages and where to look (viewer, readiness, every process's
metrics, logs), and on Ctrl-C stops every process and drops the database. The judge is the
offline one unless ``--judge env``: numbers without a GPU, the same as ``drcredit score``
gives in-process.
"""

from __future__ import annotations

import json
import shlex
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from drcredit.client import DrCreditClient
from drcredit.client.errors import DrCreditError
from drcredit_cli.consoles import err, out
from drcredit_cli.table import print_advantages
from drcredit_cli.trial_stack import Process, Stack, TrialError, own_audit_judges

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


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
    try:
        loaded: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TrialError(f"{path}: {exc}") from exc
    return loaded


def _summary(base: str, stack: Stack, group_ids: list[str], keep: bool) -> None:
    processes = stack.processes
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
    say(f"  logs       {stack.logs}/")
    say(f"  database   {stack.database} ({'kept' if keep else 'dropped'} when the trial stops)")
    own = " (a redis-server of the trial's own)" if stack.redis is not None else ""
    say(f"  broker     {stack.broker_url}{own}")
    judge = "offline" if own_audit_judges() is None else "NAME"
    say(f"  audit      drcredit audit start --judge {judge} --group {group_ids[0]} --wait 60 --url {base}")
    say("  to run drcredit commands on this stack (another worker, a report), export:")
    # DRCREDIT_URL: the commands that talk to the service (audit, labels) default to port 8000.
    exports = {**stack.settings(), "DRCREDIT_URL": base}
    say("             " + " ".join(f"{k}={shlex.quote(v)}" for k, v in exports.items()))


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
            metavar="GROUP.json",
            help="Groups to score (default: examples/group.json and examples/group_judged.json).",
        ),
    ] = None,
    postgres: Annotated[
        str, typer.Option(help="A Postgres server on which to create the trial's database (dropped at exit).")
    ] = "postgresql://postgres@127.0.0.1:5432/postgres",
    redis_url: Annotated[
        str | None,
        typer.Option(
            "--redis", help="An empty Redis database for the queues (default: a redis-server of the trial's own)."
        ),
    ] = None,
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
    stack = Stack(postgres, redis_url, judge, logs, port, metrics_port)
    # Said explicitly: a shell without job control starts background commands with SIGINT
    # ignored, and Ctrl-C (or kill -INT) must stop the trial wherever it was started.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    code = 0
    try:
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise TrialError(f"no such file: {', '.join(missing)}")
        stack.up()
        base = f"http://127.0.0.1:{port}"
        with DrCreditClient(base, timeout=30) as client:
            err.print(f"starting the API and {len(stack.processes) - 1} workers (logs in {logs}/) ...", highlight=False)
            _wait_ready(client, stack.processes)
            group_ids = _score_examples(client, files)
        _summary(base, stack, group_ids, keep)
        if not exit_when_scored:
            out.print("Ctrl-C stops every process.", highlight=False)
            _watch(stack.processes)
    except KeyboardInterrupt:
        pass
    except (TrialError, DrCreditError) as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        code = 2
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave processes behind
        stack.down(keep)
    raise typer.Exit(code)
