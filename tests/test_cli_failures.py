"""The command line on a bad day: exit codes, and one line for every mistake."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import drcredit
from tests.support.infra import postgres_database
from tests.support.judge_server import Reply, running_judge
from tests.support.live import free_port
from tests.test_cli import EXAMPLE, Run, run

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def one_error_line(result: Run, code: int, *needles: str) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def test_version(tmp_path: Path) -> None:
    result = run(tmp_path, "--version")
    assert result.returncode == 0 and result.stdout.strip() == f"drcredit {drcredit.__version__}"


def test_a_dead_judge_is_a_failed_group_never_a_table_of_zeros(tmp_path: Path) -> None:
    """Connections refused: the judgments wait for the judge up to the deadline, then the
    group fails with the reason and the command exits 3 with nothing on stdout."""
    env = {
        "DRCREDIT_JUDGE": "openai",
        "DRCREDIT_JUDGE_BASE_URL": f"http://127.0.0.1:{free_port()}/v1",
        "DRCREDIT_JUDGE_MODEL": "m",
        "DRCREDIT_JUDGE_MAX_ATTEMPTS": "2",
        "DRCREDIT_JUDGE_BACKOFF_INITIAL_S": "0.05",
        "DRCREDIT_JUDGE_OUTAGE_DEADLINE_S": "3",
    }
    result = run(tmp_path, "score", str(EXAMPLE), env=env)
    one_error_line(result, 3, "failed", "unreachable", "outage deadline")
    assert result.stdout == ""
    assert "waiting for it" in result.stderr


def always_malformed(_: Any) -> Reply:
    return Reply(content="not json at all")


def test_failed_judgments_exit_4_unless_allowed_and_are_shown(tmp_path: Path) -> None:
    with running_judge(always_malformed) as judge:
        env = {
            "DRCREDIT_JUDGE": "openai",
            "DRCREDIT_JUDGE_BASE_URL": judge.url,
            "DRCREDIT_JUDGE_MODEL": "m",
            "DRCREDIT_JUDGE_MAX_ATTEMPTS": "1",
        }
        refused = run(tmp_path / "a", "score", str(EXAMPLE), env=env)
        one_error_line(refused, 4, "judgment(s) failed", "--allow-failures")
        # The reasons follow, by kind with an example: the temporary database is gone after.
        assert re.search(r"^  \d+ x invalid after 1 attempts: ", refused.stderr, re.MULTILINE), refused.stderr
        # A turn row ends in the note column's flag (the legend below the table names it too).
        assert re.search(r"\b(search|visit)\b.*\bunscorable$", refused.stdout, re.MULTILINE), refused.stdout
        allowed = run(tmp_path / "b", "score", str(EXAMPLE), "--json", "--allow-failures", env=env)
    assert allowed.returncode == 0, allowed.stderr
    doc = json.loads(allowed.stdout)
    assert doc["progress"]["judgments_failed"] == doc["progress"]["judge_calls"] > 0
    flagged = [t for r in doc["rollouts"] for t in r["turns"] if t["unscorable"]]
    assert flagged and all(t["credit"] == 0.0 for t in flagged if t["type"] == "visit")


@pytest.mark.parametrize(
    ("env", "args", "needles"),
    [
        ({"DRCREDIT_JUDGE": "openai"}, ["score", str(EXAMPLE)], ["DRCREDIT_JUDGE_MODEL"]),
        ({"DRCREDIT_JUDGE": "gpt"}, ["score", str(EXAMPLE)], ["invalid configuration", "DRCREDIT_JUDGE"]),
        ({"DRCREDIT_LEASE_S": "-1"}, ["score", str(EXAMPLE)], ["DRCREDIT_LEASE_S"]),
        ({"DRCREDIT_JUDGE_PRICE": "0.15,free,0.6"}, ["score", str(EXAMPLE)], ["DRCREDIT_JUDGE_PRICE", "'free'"]),
        ({"DRCREDIT_JUDGE_PRICE": "0.15,0.6"}, ["serve"], ["DRCREDIT_JUDGE_PRICE", "in,cached,out"]),
        ({}, ["score", "examples"], ["is a directory"]),
        ({"DRCREDIT_API_KEYS": "acme-without-key"}, ["serve"], ["DRCREDIT_API_KEYS", "tenant:key"]),
        (
            {"DRCREDIT_DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:1/none"},
            ["serve"],
            ["cannot reach the database", "DRCREDIT_DATABASE_URL"],
        ),
        ({}, ["worker"], ["DRCREDIT_BROKER_URL"]),
        (
            {"DRCREDIT_AUDIT_JUDGES": '{"small": '},
            ["serve"],
            ["invalid configuration: DRCREDIT_AUDIT_JUDGES: not valid JSON (Expecting value: line 1 column 11"],
        ),
        (
            {"DRCREDIT_AUDIT_JUDGES": '{"small": {"base_url": "http://127.0.0.1:1/v1", "wieght": 1}}'},
            ["serve"],
            ["DRCREDIT_AUDIT_JUDGES.small.wieght: unknown field"],
        ),
    ],
)
def test_configuration_mistakes_are_one_line(
    tmp_path: Path, env: dict[str, str], args: list[str], needles: list[str]
) -> None:
    one_error_line(run(tmp_path, *args, env=env), 2, *needles)


def test_a_configuration_mistake_stays_one_line_on_a_narrow_terminal(tmp_path: Path) -> None:
    """A log or a terminal 40 columns wide: the message is not wrapped, so the line the
    docs quote can be searched for."""
    env = {"COLUMNS": "40", "DRCREDIT_API_KEYS": "a:k1", "DRCREDIT_TENANTS": '{"a": {"burst": {"weight": 4}}}'}
    one_error_line(
        run(tmp_path, "serve", env=env),
        2,
        "error: invalid configuration: DRCREDIT_TENANTS.a.burst.seconds: Field required (got {'weight': 4})",
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"DRCREDIT_JUDGE_REUSE": "bogus"},
            "DRCREDIT_JUDGE_REUSE: unknown value 'bogus' (allowed: tenant, group, off)",
        ),
        ({"DRCREDIT_JUDGE_PROMPT_LAYOUT": "bogus"}, "DRCREDIT_JUDGE_PROMPT_LAYOUT: unknown value 'bogus'"),
        (
            {"DRCREDIT_TENANTS": '{"a": {"on_budget": "x"}}', "DRCREDIT_API_KEYS": "a:k1"},
            "DRCREDIT_TENANTS.a.on_budget: Input should be 'refuse' or 'wait'",
        ),
        (  # a check across settings: its message names the setting itself
            {"DRCREDIT_TENANTS": '{"nobody": {}}', "DRCREDIT_API_KEYS": "a:k1"},
            "DRCREDIT_TENANTS.nobody: no key of DRCREDIT_API_KEYS belongs to this tenant",
        ),
    ],
)
def test_a_configuration_mistake_names_its_setting_once(tmp_path: Path, env: dict[str, str], expected: str) -> None:
    line = one_error_line(run(tmp_path, "serve", env=env), 2, f"error: invalid configuration: {expected}")
    setting = expected.split(":")[0].split(".")[0]
    assert line.count(setting + ":") + line.count(setting + ".") == 1, line
    assert "Value error" not in line and "DRCREDIT_:" not in line, line


def test_a_worker_on_a_schema_behind_exits_naming_the_upgrade(tmp_path: Path) -> None:
    with postgres_database() as url:
        env = {
            "DRCREDIT_DATABASE_URL": url,
            "DRCREDIT_AUTO_MIGRATE": "false",
            "DRCREDIT_BROKER_URL": "redis://127.0.0.1:6379/9",
        }
        one_error_line(run(tmp_path, "worker", env=env), 2, "drcredit db upgrade")


def test_the_judged_example_scores_end_to_end_with_the_offline_judge(tmp_path: Path) -> None:
    """examples/group_judged.json: no reward given; the service judges every report."""
    result = run(tmp_path, "score", "examples/group_judged.json", "--json")
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    assert doc["params"]["outcome_source"] == "judge" and doc["progress"]["judgments_failed"] == 0
    rewards = [r["outcome_reward"] for r in doc["rollouts"]]
    assert all(isinstance(r, float) for r in rewards) and len(set(rewards)) > 1
    assert doc["stats"]["sigma_o"] > 0
