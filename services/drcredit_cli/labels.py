"""``drcredit labels``: people's labels in and out of a running service as JSON Lines, so
that labels made elsewhere (another tool, another deployment) can come in (docs/audit.md).

An export writes one label a line, as ``GET /v1/labels`` lists them; an import reads the
same lines (``item_id``, or ``group_id``, ``kind`` and ``key``; ``value``; ``labeler``)
and stores them all, or, when any line is refused, none: every refusal is named by its
line number and field. Exit codes as ``drcredit audit``'s: 2 bad input, 5 the service
could not be reached.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO, Annotated, Any

import typer

from drcredit.client import DrCreditClient, InvalidRequest
from drcredit_cli import consoles
from drcredit_cli.audit import DEFAULT_URL, ApiKey, Url, service
from drcredit_cli.consoles import err, fail
from drcredit_cli.flags import Command, Group

labels_app = typer.Typer(
    help=(
        "People's labels of the judge's judgments on a running service, as JSON Lines: export "
        "them, or import labels made elsewhere (all or none). Label them in the viewer's "
        "labeling page; compare them with the judge by 'drcredit audit start --judge human'."
    ),
    no_args_is_help=True,
    cls=Group,
)

#: The fields a line may carry: a label's, and what an export adds to it.
LABEL_FIELDS = ("item_id", "group_id", "kind", "key", "value", "labeler")
EXPORTED_ONLY = ("created_at", "updated_at")


def read_lines(stream: IO[str], labeler: str | None) -> tuple[list[dict[str, Any]], list[int]]:
    """The labels of a JSON Lines stream and the line number of each (blank lines skipped);
    a line that is not a label object fails naming its number."""
    labels: list[dict[str, Any]] = []
    numbers: list[int] = []
    for number, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError as exc:
            fail(f"line {number}: not JSON ({exc})")
        if not isinstance(doc, dict):
            fail(f"line {number}: a label is a JSON object, got {type(doc).__name__}")
        unknown = [k for k in doc if k not in LABEL_FIELDS and k not in EXPORTED_ONLY]
        if unknown:
            fail(f"line {number}: {unknown[0]}: unknown field (a label has {', '.join(LABEL_FIELDS)})")
        label = {k: v for k, v in doc.items() if k in LABEL_FIELDS}
        if labeler is not None:
            label.setdefault("labeler", labeler)
        if label.get("item_id") is not None and label.get("group_id") is not None:
            # An exported line names its judgment twice; the item id is enough.
            label = {k: v for k, v in label.items() if k not in ("group_id", "kind", "key")}
        labels.append(label)
        numbers.append(number)
    return labels, numbers


def _by_line(exc: InvalidRequest, numbers: list[int]) -> str:
    """The service's ``labels[i].field`` refusals as ``line N: field: message``."""
    out = []
    for e in exc.errors:
        field = str(e.get("field") or "")
        head, dot, rest = field.partition("].")
        if field.startswith("labels[") and dot:
            index = int(head[len("labels[") :])
            where = f"line {numbers[index]}" if index < len(numbers) else field
            out.append(f"{where}: {rest}: {e['message']}")
        else:
            out.append(f"{field}: {e['message']}" if field else str(e["message"]))
    return "; ".join(out) or exc.message


@labels_app.command("import", cls=Command)
def import_(
    path: Annotated[str, typer.Argument(metavar="FILE", help="JSON Lines, one label a line ('-': standard input).")],
    labeler: Annotated[
        str | None, typer.Option("--labeler", help="The labeler of the lines that name none.", show_default=False)
    ] = None,
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Store the file's labels: all of them, or none when any line is refused (named by its number)."""
    if path == "-":
        labels, numbers = read_lines(sys.stdin, labeler)
    else:
        try:
            with Path(path).open(encoding="utf-8") as stream:
                labels, numbers = read_lines(stream, labeler)
        except OSError as exc:
            fail(f"cannot read {path}: {exc.strerror or exc}")
    if not labels:
        fail(f"{path}: no label in it")
    with service(url, api_key) as client:
        try:
            stored = client.import_labels(labels)
        except InvalidRequest as exc:
            fail(_by_line(exc, numbers) + " (nothing was stored)")
    consoles.out.print(
        f"stored {stored['stored']:,} labels ({stored['replaced']:,} replaced an earlier one)", highlight=False
    )


@labels_app.command("export", cls=Command)
def export(
    group: Annotated[
        list[str] | None, typer.Option("--group", help="Only this group's labels (repeat).", show_default=False)
    ] = None,
    labeler: Annotated[str | None, typer.Option("--labeler", help="Only this labeler's.", show_default=False)] = None,
    out: Annotated[
        str, typer.Option("--out", metavar="FILE", help="Write here instead of standard output.", show_default=False)
    ] = "-",
    url: Url = DEFAULT_URL,
    api_key: ApiKey = None,
) -> None:
    """Write this tenant's labels as JSON Lines, one label a line, by group and key."""
    with service(url, api_key) as client:
        labels = _labels(client, group, labeler)
    text = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in labels)
    if out == "-":
        sys.stdout.write(text)
    else:
        Path(out).write_text(text, encoding="utf-8")
        err.print(f"wrote {len(labels):,} labels to {out}", highlight=False)


def _labels(client: DrCreditClient, group: list[str] | None, labeler: str | None) -> list[dict[str, Any]]:
    return client.list_labels(group_ids=group or None, labeler=labeler)
