"""The ``drcredit`` command line, run as a subprocess on ``examples/group.json``.

Each run uses the offline judge and a private data directory. The three scoring runs
(JSON, table, JSON with a cap override) take a few seconds each, so they start together
in one module fixture and the tests read their results.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from drcredit.domain.params import ScoringParams
from drcredit_api.app import create_app
from drcredit_cli.main import app
from tests.support.api import settings_for
from tests.support.live import free_port, serving

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "group.json"
TIMEOUT = 120


def drcredit_command() -> list[str]:
    """The installed ``drcredit`` script of this interpreter's environment, else the module."""
    script = shutil.which("drcredit", path=str(Path(sys.executable).parent)) or shutil.which("drcredit")
    return [script] if script else [sys.executable, "-m", "drcredit_cli.main"]


def cli_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRCREDIT_")}
    # A wide terminal so rich neither wraps table rows nor error messages.
    env.update(DRCREDIT_JUDGE="offline", DRCREDIT_DATA_DIR=str(data_dir), COLUMNS="200", NO_COLOR="1", TERM="dumb")
    env.update(extra)
    return env


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str

    def document(self) -> dict[str, Any]:
        assert self.returncode == 0, self.stderr
        doc: dict[str, Any] = json.loads(self.stdout)
        return doc


def start(data_dir: Path, *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    data_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [*drcredit_command(), *args],
        cwd=cwd,
        env=cli_env(data_dir, **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> Run:
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"drcredit did not finish in {TIMEOUT}s:\n{stderr}")
    return Run(process.returncode, stdout, stderr)


def run(tmp_path: Path, *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> Run:
    return finish(start(tmp_path / "data", *args, cwd=cwd, env=env))


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    """Default JSON, default table, ``cap 0.5`` JSON and an 80-column table, started concurrently."""
    base = tmp_path_factory.mktemp("cli")
    processes = {
        "json": start(base / "json", "score", "examples/group.json", "--json"),
        "table": start(base / "table", "score", "examples/group.json"),
        "cap": start(base / "cap", "score", "examples/group.json", "--params", '{"cap": 0.5}', "--json"),
        "narrow": start(base / "narrow", "score", "examples/group.json", env={"COLUMNS": "80"}),
    }
    try:
        yield {name: finish(p) for name, p in processes.items()}
    finally:
        for p in processes.values():
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def example() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(EXAMPLE.read_text())
    return doc


def non_final(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(rollout, turn) for every turn that carries a credit, i.e. all but a final answer."""
    return [(r, t) for r in doc["rollouts"] for t in r["turns"] if t["credit"] is not None]


# ----------------------------------------------------------------------------- score --json


def test_score_json_prints_the_advantages_document(scored: dict[str, Run], example: dict[str, Any]) -> None:
    doc = scored["json"].document()
    assert doc["group_id"] == "demo-step1-q1"
    assert doc["status"] == "done"
    assert doc["params"] == ScoringParams().model_dump(mode="json")
    assert [r["id"] for r in doc["rollouts"]] == [r["id"] for r in example["rollouts"]] == [f"r{i}" for i in range(8)]
    for out, given in zip(doc["rollouts"], example["rollouts"], strict=True):
        assert out["outcome_reward"] == given["outcome_reward"]
        assert [t["index"] for t in out["turns"]] == list(range(len(given["turns"])))
        assert [t["type"] for t in out["turns"]] == [t["type"] for t in given["turns"]]
        for turn in out["turns"]:
            if turn["type"] == "answer":
                assert turn["index"] == len(given["turns"]) - 1
                assert turn["credit"] is None and turn["process_advantage"] is None
                assert turn["advantage"] == out["outcome_advantage"]
            else:
                assert turn["credit"] is not None and 0.0 <= turn["credit"] <= 1.0
                assert turn["process_advantage"] is not None
    # r3 hit the turn limit: no answer turn, every turn has a process term.
    assert all(t["credit"] is not None for t in doc["rollouts"][3]["turns"])


def test_score_json_outcome_advantages_follow_spec(scored: dict[str, Run], example: dict[str, Any]) -> None:
    """A_o = (r - mean) / sample std over the 8 input rewards (docs/method.md, "Advantages")."""
    doc = scored["json"].document()
    rewards = [r["outcome_reward"] for r in example["rollouts"]]
    mu = math.fsum(rewards) / len(rewards)
    sd = math.sqrt(math.fsum((r - mu) ** 2 for r in rewards) / (len(rewards) - 1))
    assert doc["stats"]["mu_o"] == pytest.approx(mu, abs=1e-12)
    assert doc["stats"]["sigma_o"] == pytest.approx(sd, abs=1e-12)
    got = [r["outcome_advantage"] for r in doc["rollouts"]]
    assert got == [pytest.approx((r - mu) / sd, abs=1e-9) for r in rewards]
    assert abs(math.fsum(got) / len(got)) <= 1e-9


def test_score_json_process_advantages_are_normalized_and_fused(scored: dict[str, Run]) -> None:
    """Over all non-final turns: mu_rg / sigma_rg (population) of the credits, A_rg with
    mean 0 and std 1, and A = A_o + A_rg under the default parameters."""
    doc = scored["json"].document()
    turns = non_final(doc)
    assert len(turns) == 51  # 26 searches + 25 visits (examples/README.md)
    credits = [t["credit"] for _, t in turns]
    mu = math.fsum(credits) / len(credits)
    sigma = math.sqrt(math.fsum((c - mu) ** 2 for c in credits) / len(credits))
    assert doc["stats"]["mu_rg"] == pytest.approx(mu, abs=1e-12)
    assert doc["stats"]["sigma_rg"] == pytest.approx(sigma, abs=1e-12)
    assert sigma > 0.01
    process = [t["process_advantage"] for _, t in turns]
    assert process == [pytest.approx((c - mu) / sigma, abs=1e-9) for c in credits]
    p_mu = math.fsum(process) / len(process)
    assert abs(p_mu) <= 1e-9
    assert math.sqrt(math.fsum((x - p_mu) ** 2 for x in process) / len(process)) == pytest.approx(1.0, abs=1e-9)
    for rollout, turn in turns:
        assert turn["advantage"] == pytest.approx(rollout["outcome_advantage"] + turn["process_advantage"], abs=1e-12)


# ----------------------------------------------------------------------------- table and params


def test_score_prints_a_table_with_rollouts_and_stats(scored: dict[str, Run], example: dict[str, Any]) -> None:
    result = scored["table"]
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Advantages of group demo-step1-q1" in out
    assert re.search(r"^rollout +A_o +turn +type +credit +A_rg +D +advantage +note$", out, re.MULTILINE), out
    doc = scored["json"].document()
    for rollout in doc["rollouts"]:
        # The rollout's first row: its id, A_o, then turn 0 with its numbers.
        first = rollout["turns"][0]
        a_o = re.escape(f"{rollout['outcome_advantage']:+.4f}")
        row = rf"^{re.escape(rollout['id'])} +{a_o} +0 +{first['type']} "
        assert re.search(row, out, re.MULTILINE), (rollout["id"], out)
    rewards = [r["outcome_reward"] for r in example["rollouts"]]
    mu = math.fsum(rewards) / len(rewards)
    sd = math.sqrt(math.fsum((r - mu) ** 2 for r in rewards) / (len(rewards) - 1))
    stats = re.search(r"mu_rg=(\S+) sigma_rg=(\S+) mu_o=(\S+) sigma_o=(\S+)", out)
    assert stats, out
    assert float(stats.group(2)) > 0
    assert (stats.group(3), stats.group(4)) == (f"{mu:.4f}", f"{sd:.4f}")
    assert re.search(
        r"judge calls \d+, cache hits \d+, deterministic zeros \d+, skipped snippet calls \d+, failed 0", out
    )
    assert re.search(r"^judge: offline, a lexical stand-in", out, re.MULTILINE), out  # says which judge
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


def test_score_table_fits_80_columns_without_wrapping_a_row(scored: dict[str, Run]) -> None:
    """At 80 columns every turn is one line: the rollout label, A_o and the turn's numbers."""
    result = scored["narrow"]
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    header = next(i for i, line in enumerate(lines) if line.startswith("rollout"))
    assert lines[header].split() == ["rollout", "A_o", "turn", "type", "credit", "A_rg", "D", "advantage", "note"]
    doc = scored["json"].document()
    rows = [line.split() for line in lines[header + 2 :] if line.strip() and not line.startswith(("A_o ", "mu_rg"))]
    expected = []
    for rollout in doc["rollouts"]:
        for k, turn in enumerate(rollout["turns"]):
            label = [rollout["id"], f"{rollout['outcome_advantage']:+.4f}"] if k == 0 else []
            numbers = [turn["credit"], turn["process_advantage"], turn["discounted_process_advantage"]]
            shown = [f"{turn['credit']:.3f}"] + [f"{v:+.4f}" for v in numbers[1:]] if numbers[0] is not None else []
            expected.append([*label, str(turn["index"]), turn["type"], *shown, f"{turn['advantage']:+.4f}"])
    assert rows[: len(expected)] == expected


def test_score_params_override_caps_credits(scored: dict[str, Run]) -> None:
    doc = scored["cap"].document()
    assert doc["params"]["cap"] == 0.5
    assert {k: v for k, v in doc["params"].items() if k != "cap"} == {
        k: v for k, v in ScoringParams().model_dump(mode="json").items() if k != "cap"
    }
    credits = [t["credit"] for _, t in non_final(doc)]
    assert all(0.0 <= c <= 0.5 for c in credits)
    # The default run has credits above 0.5 (e.g. r0's first search), so the cap binds.
    assert max(credits) == 0.5
    assert max(t["credit"] for _, t in non_final(scored["json"].document())) > 0.5


# ----------------------------------------------------------------------------- errors


def assert_fails(result: Run, *needles: str) -> None:
    assert result.returncode != 0
    assert result.stdout == ""
    assert "Traceback" not in result.stderr, result.stderr
    assert "error" in result.stderr.lower()
    for needle in needles:
        assert needle in result.stderr, result.stderr


def test_missing_file_is_reported(tmp_path: Path) -> None:
    assert_fails(run(tmp_path, "score", str(tmp_path / "nope.json")), "nope.json", "no such file")


def test_invalid_json_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"question": "q", "rubrics": [')
    assert_fails(run(tmp_path, "score", str(bad)), "bad.json", "invalid JSON", "line 1")


def test_invalid_group_names_the_field_path(tmp_path: Path, example: dict[str, Any]) -> None:
    doc = json.loads(json.dumps(example))
    doc["rollouts"][1]["id"] = doc["rollouts"][0]["id"]
    dup = tmp_path / "dup.json"
    dup.write_text(json.dumps(doc))
    assert_fails(run(tmp_path, "score", str(dup)), "invalid group", "rollouts[1].id", "duplicate rollout id")


def test_unknown_parameter_is_reported(tmp_path: Path) -> None:
    result = run(tmp_path, "score", str(EXAMPLE), "--params", '{"bogus": 1}')
    assert_fails(result, "params.bogus", "unknown field")


# ----------------------------------------------------------------------------- help


def test_help_lists_the_commands(tmp_path: Path) -> None:
    result = run(tmp_path, "--help")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for command, what in (
        ("score", "Score one group"),
        ("serve", "REST API"),
        ("db", "Database schema"),
        ("audit", "Judge audits"),
    ):
        assert re.search(rf"\b{command}\b.*{what}", out), (command, out)


def test_score_help_documents_its_options(tmp_path: Path) -> None:
    result = run(tmp_path, "score", "--help")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "GROUP.json" in out
    assert re.search(r"--params\b.*JSON object of parameter overrides", out), out
    assert re.search(r"--json\b.*advantages document", out), out
    # Flags are shown as flags: no value type after them (typer's default is `--json <bool>`).
    assert re.search(r"--json +Print the advantages document", out), out
    assert re.search(r"--allow-failures +Exit 0", out), out
    assert re.search(r"--params +<str> +JSON object", out), out  # an option with a value keeps its type


HELP_PAGES = [
    [],
    ["score"],
    ["serve"],
    ["worker"],
    ["report"],
    ["trial"],
    ["db"],
    ["db", "upgrade"],
    ["audit"],
    ["audit", "start"],
    ["audit", "show"],
    ["audit", "list"],
]


@pytest.mark.parametrize("command", HELP_PAGES)
def test_no_help_page_shows_a_value_for_a_flag(command: list[str]) -> None:
    """Every command's --help, its own flags and --help itself included, shows no <bool>."""
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "--help" in result.output and "Show this message and exit." in result.output
    assert "<bool>" not in result.output, result.output


@pytest.mark.parametrize("command", HELP_PAGES)
def test_help_prose_fills_an_80_column_terminal(command: list[str]) -> None:
    """A description paragraph wraps at the terminal's width: no line but a paragraph's
    last is left short (the source's own line breaks kept would leave a word or two alone
    on every other line)."""
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    prose = result.output.split("Usage:", 1)[1].split("╭", 1)[0].splitlines()[1:]
    lines = [line.strip() for line in prose]
    for line, following in itertools.pairwise(lines):
        if line and following:  # not a paragraph's last line
            assert len(line) > 50, f"{line!r} then {following!r} in:\n{result.output}"


# ----------------------------------------------------------------------------- serve


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_serve_logs_start_and_stop_without_escape_codes(tmp_path: Path, log_format: str) -> None:
    """uvicorn's start and stop lines carry a coloured copy of their message; neither log
    format may pass its ANSI escape codes on."""
    port = free_port()
    process = start(tmp_path / "data", "serve", "--port", str(port), env={"DRCREDIT_LOG_FORMAT": log_format})
    try:
        deadline = time.monotonic() + TIMEOUT
        while not _answers(f"http://127.0.0.1:{port}/healthz"):
            assert process.poll() is None and time.monotonic() < deadline, "drcredit serve did not come up"
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGINT)  # uvicorn's graceful stop, as CTRL+C
    result = finish(process)
    assert result.returncode == 0, result.stderr
    for line in ("Started server process", f"Uvicorn running on http://127.0.0.1:{port}", "Finished server process"):
        assert line in result.stderr, result.stderr
    assert "\x1b" not in result.stderr and "\\u001b" not in result.stderr and "color_message" not in result.stderr
    if log_format == "json":
        records = [json.loads(line) for line in result.stderr.splitlines()]
        assert any(r["event"].startswith("Started server process") for r in records)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


# ----------------------------------------------------------------------------- report


def test_report_of_an_unknown_run_names_the_known_ones(tmp_path: Path) -> None:
    data, fresh = tmp_path / "data", tmp_path / "fresh"
    assert finish(start(fresh, "db", "upgrade")).returncode == 0  # a database with no group at all
    empty = finish(start(fresh, "report", "run", "nope", "-o", str(tmp_path / "x.html")))
    assert_fails(empty, "run 'nope' not found", "no run is stored yet", "metadata.run")
    stored = finish(start(data, "score", str(EXAMPLE), "--store", "--json"))
    assert stored.returncode == 0, stored.stderr  # examples/group.json is in run "demo"
    unknown = finish(start(data, "report", "run", "demmo", "-o", str(tmp_path / "x.html")))
    assert_fails(unknown, "run 'demmo' not found; known runs, newest first: demo")
    assert not (tmp_path / "x.html").exists()
    # The same through a running service (its GET /v1/runs).
    with serving(create_app(settings_for(f"sqlite:///{data / 'drcredit.sqlite3'}", None))) as url:
        remote = finish(start(data, "report", "run", "demmo", "--url", url, "-o", str(tmp_path / "x.html")))
    assert_fails(remote, "run 'demmo' not found; known runs, newest first: demo")
    known = finish(start(data, "report", "run", "demo", "-o", str(tmp_path / "demo.html")))
    assert known.returncode == 0, known.stderr
    assert "wrote" in known.stderr and (tmp_path / "demo.html").stat().st_size > 0


def test_report_without_a_database_says_where_to_read_from_and_creates_nothing(tmp_path: Path) -> None:
    """Where no service ever stored anything (scripts/demo keeps nothing), the report says
    how to point it at the data instead of creating an empty SQLite file and failing on it."""
    data = tmp_path / "data"
    missing = run(tmp_path, "report", "run", "demo", "-o", str(tmp_path / "x.html"))
    assert_fails(missing, f"no database at {data / 'drcredit.sqlite3'}", "DRCREDIT_DATABASE_URL", "--url")
    assert list(data.iterdir()) == [] and not (tmp_path / "x.html").exists()
    (data / "other.sqlite3").touch()  # a file, but not a DrCredit database
    empty = run(tmp_path, "report", "run", "demo", env={"DRCREDIT_DATABASE_URL": f"sqlite:///{data / 'other.sqlite3'}"})
    assert_fails(empty, "has no DrCredit tables", "DRCREDIT_DATABASE_URL", "--url")
