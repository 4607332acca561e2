"""The alert rules (deploy/alerts.yml) checked and unit-tested by Prometheus's own promtool.

`promtool check rules` parses every rule; `promtool test rules` runs the cases of
tests/deploy/alerts_test.yml, one pytest per alert (the case groups named after it), each
with a case that fires and one that does not. Debian's `prometheus` package provides
promtool (scripts/test installs it when it is missing).
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "deploy" / "alerts.yml"
CASES = Path(__file__).resolve().parent / "alerts_test.yml"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: install Debian's prometheus package (scripts/test does)")
    return found


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def alert_names() -> list[str]:
    return [r["alert"] for r in rules() if "alert" in r]


def cases() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CASES.read_text())
    return loaded


def run_cases(
    tmp_path: Path, tests: list[dict[str, Any]], rules_file: Path = ALERTS
) -> subprocess.CompletedProcess[str]:
    doc = {**cases(), "rule_files": [str(rules_file)], "tests": tests}
    path = tmp_path / "cases.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120)


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_promtool_check_rejects_a_broken_rule(tmp_path: Path) -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    doc["groups"][0]["rules"][0]["expr"] = "max by (queue) (drcredit_queue_depth > "
    broken = tmp_path / "alerts.yml"
    broken.write_text(yaml.safe_dump(doc))
    done = subprocess.run([promtool(), "check", "rules", str(broken)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0


def test_every_alert_has_cases_that_fire_and_that_do_not() -> None:
    tested: dict[str, list[list[Any]]] = {}
    for case in cases()["tests"]:
        for check in case["alert_rule_test"]:
            assert check["alertname"] == case["name"], f"{case['name']}: tests {check['alertname']}"
            tested.setdefault(case["name"], []).append(check["exp_alerts"])
    assert sorted(tested) == sorted(alert_names())
    for name, expectations in tested.items():
        assert any(expectations), f"{name}: no case where it fires"
        assert any(not e for e in expectations), f"{name}: no case where it stays silent"


def test_every_alert_names_its_severity_and_runbook() -> None:
    operations = (REPO / "docs" / "operations.md").read_text()
    for rule in rules():
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["runbook"] == f"docs/operations.md, section Alerts: {rule['alert']}"
        assert f"`{rule['alert']}`" in operations, f"{rule['alert']} not explained in docs/operations.md"


@pytest.mark.parametrize("alert", alert_names())
def test_alert_rule(alert: str, tmp_path: Path) -> None:
    mine = [c for c in cases()["tests"] if c["name"] == alert]
    done = run_cases(tmp_path, mine)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_test_fails_when_a_rule_changes(tmp_path: Path) -> None:
    """The cases pin the rules: the budget line moved from 0.9 to 0.99 fails its case."""
    doc = yaml.safe_load(ALERTS.read_text())
    moved = copy.deepcopy(doc)
    for rule in moved["groups"][0]["rules"]:
        if rule["alert"] == "DrcreditBudgetNearlySpent":
            rule["expr"] = rule["expr"].replace("> 0.9", "> 0.99")
    path = tmp_path / "alerts.yml"
    path.write_text(yaml.safe_dump(moved))
    done = run_cases(tmp_path, [c for c in cases()["tests"] if c["name"] == "DrcreditBudgetNearlySpent"], path)
    assert done.returncode != 0
    assert "FAILED" in done.stdout + done.stderr
