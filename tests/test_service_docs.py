"""The documents name every service the code has, and no other.

The one list is ``SERVICES`` in ``drcredit.broker.queues`` (the CLI's ``--queues``, the
deployment files' tests and ``drcredit trial`` read it). A deployment built from a
document that misses a service leaves a queue nobody consumes: these tests read the
documents' tables and command blocks as a newcomer would and compare them with it.
"""

from __future__ import annotations

import re
from pathlib import Path

from markdown_it import MarkdownIt

from drcredit.broker.queues import SERVICES, WORKER_SERVICES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
OPERATIONS = ROOT / "docs" / "operations.md"


def table(path: Path, first_header: str) -> list[list[str]]:
    """The body rows (cells as Markdown source) of the table whose first header is ``first_header``."""
    tokens = MarkdownIt().enable("table").parse(path.read_text())
    tables: list[list[list[str]]] = []
    inside = False
    for token in tokens:
        if token.type in ("table_open", "table_close"):
            inside = token.type == "table_open"
            if inside:
                tables.append([])
        elif inside and token.type == "tr_open":
            tables[-1].append([])
        elif inside and token.type == "inline":
            tables[-1][-1].append(token.content)
    found = [rows for rows in tables if rows and rows[0] and rows[0][0] == first_header]
    assert len(found) == 1, f"{path.name}: expected one table headed {first_header!r}, found {len(found)}"
    return found[0][1:]


def code_blocks(path: Path) -> list[str]:
    return [t.content for t in MarkdownIt().parse(path.read_text()) if t.type == "fence"]


def test_the_parts_of_operations_are_the_services_of_the_code() -> None:
    rows = table(OPERATIONS, "process")
    processes = {name: command for name, command, _ in rows if command}
    assert processes == {s.name: f"`{s.command}`" for s in SERVICES}
    assert {name for name, command, _ in rows if not command} == {"Postgres", "Redis"}


def test_the_readme_service_table_is_the_services_of_the_code() -> None:
    rows = [row[:3] for row in table(README, "service")]
    assert rows == [[s.name, f"`services/{s.package}`", f"`{s.queue}`" if s.queue else "—"] for s in SERVICES]


def test_the_readme_by_hand_block_starts_every_service_with_its_own_metrics_port() -> None:
    [block] = [b for b in code_blocks(README) if "drcredit serve --host " in b]
    ports = []
    for service in WORKER_SERVICES:
        [line] = [line for line in block.splitlines() if f"{service.command} " in line]
        port = re.match(r"DRCREDIT_METRICS_PORT=(\d+) ", line)
        assert port, f"the {service.name} is started without DRCREDIT_METRICS_PORT: {line}"
        ports.append(port.group(1))
    assert len(set(ports)) == len(ports), "two workers on one metrics port"
    workers = [line for line in block.splitlines() if "drcredit worker" in line]
    assert len(workers) == len(WORKER_SERVICES), "a worker line for no service"
    assert "http://judge:" not in block, "a judge URL that resolves nowhere outside compose"


def test_the_trial_shows_every_process_metrics() -> None:
    [block] = [b for b in code_blocks(OPERATIONS) if "The distributed stack is running" in b]
    for service in SERVICES:
        assert re.search(rf"^\s+{service.name}\s+http://127\.0\.0\.1:\d+/metrics$", block, re.MULTILINE), service.name


def test_the_table_reader_sees_a_missing_service(tmp_path: Path) -> None:
    """The reader above is what the first test relies on: a row taken out is seen."""
    text = OPERATIONS.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| outcome judge |"))
    tampered = tmp_path / "operations.md"
    tampered.write_text(text.replace(row + "\n", ""))
    names = {name for name, command, _ in table(tampered, "process") if command}
    assert names == {s.name for s in SERVICES} - {"outcome judge"}
