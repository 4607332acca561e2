"""``drcredit audit`` as a subprocess against a served API (SQLite, the marker judge) with
audit judges configured: the marker script again ("same"), one that says level 1 where
the marker says 2 ("shifted": the hand-worked figures of tests/api/test_audits.py), a
slow one and one nobody serves ("down"). Tables are checked against the API's document,
errors are one line with their exit code."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from drcredit_api.app import create_app
from tests.api.test_audits import shifted, three_rollouts
from tests.support.api import settings_for
from tests.support.judge_server import Call, Reply, marker_answer, marker_script, running_judge
from tests.support.live import free_port, serving
from tests.test_cli import Run, run
from tests.test_cli_failures import one_error_line


class Served(NamedTuple):
    url: str
    data: Path

    def env(self, key: str = "k1", **extra: str) -> dict[str, str]:
        return {"DRCREDIT_URL": self.url, "DRCREDIT_API_KEY": key, **extra}

    def api(self, path: str, key: str = "k1") -> Any:
        r = httpx.get(self.url + path, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    def audit(self, *args: str, key: str = "k1", **env: str) -> Run:
        return run(self.data, "audit", *args, env=self.env(key, **env))


def slow(call: Call) -> Reply:
    return Reply.json(marker_answer(call), delay=10.0)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("cli-audit")
    with (
        running_judge(marker_script) as main,
        running_judge(lambda c: Reply.json(marker_answer(c))) as same,
        running_judge(shifted) as shift,
        running_judge(slow) as slowly,
    ):
        judges = {
            "same": {"base_url": same.url, "model": "judge-test"},
            "shifted": {"base_url": shift.url, "model": "judge-b"},
            "slow": {"base_url": slowly.url, "model": "judge-s", "timeout_s": 60},
            "down": {
                "base_url": f"http://127.0.0.1:{free_port()}/v1",
                "model": "judge-c",
                "max_attempts": 1,
                "outage_deadline_s": 1.0,
            },
        }
        settings = settings_for(
            f"sqlite:///{base / 'api.sqlite3'}",
            main.url,
            audit_judges=judges,
            api_keys="t1:k1,t2:k2,t3:k3",
            # t3 spends its day's budget on its first group: its audits are then refused.
            tenants='{"t3": {"budget": {"tokens_per_day": 1}}}',
        )
        with serving(create_app(settings)) as url:
            with httpx.Client(base_url=url, headers={"Authorization": "Bearer k1"}, timeout=60) as c:
                body = {"batch_id": "b1", "groups": [three_rollouts("g0", 0), three_rollouts("g1", 1)]}
                assert c.post("/v1/batches", json=body).status_code == 202
                assert c.post("/v1/groups", json=three_rollouts("g2", 2)).status_code == 202
                for gid in ("g0", "g1", "g2"):
                    assert c.get(f"/v1/groups/{gid}/advantages", params={"wait": 60}).status_code == 200
            with httpx.Client(base_url=url, headers={"Authorization": "Bearer k3"}, timeout=60) as c:
                assert c.post("/v1/groups", json=three_rollouts("g3", 3)).status_code == 202
                assert c.get("/v1/groups/g3/advantages", params={"wait": 60}).status_code == 200
            yield Served(url, base / "cli")


def cells(table: str, label: str) -> list[str]:
    """The cells after ``label`` of the one table row starting with it."""
    rows = [line.strip() for line in table.splitlines() if re.match(re.escape(label) + r"\s", line.strip())]
    assert len(rows) == 1, (label, table)
    return rows[0][len(label) :].split()


def marginal_rows(out: str, kind: str) -> tuple[list[str], list[str]]:
    """The marginals table's two rows of ``kind``: the original's shares, the other side's name and shares."""
    lines = [line.strip() for line in out.splitlines()]
    at = next(i for i, x in enumerate(lines) if x.split()[:2] == [kind, "original"])
    return lines[at].split()[2:], lines[at + 1].split()


def test_start_waits_and_prints_the_report_as_tables(served: Served) -> None:
    result = served.audit("start", "--judge", "shifted", "--group", "g0", "--wait", "60")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    audit_id = re.search(r"audit (aud-[0-9a-f]+) done", out)
    assert audit_id, out
    doc = served.api(f"/v1/audits/{audit_id.group(1)}")
    assert "audit judge shifted (judge-b), groups g0, 1 group sampled (seed 0)" in out
    # Visit pairs (original, audit), worked by hand in tests/api/test_audits.py: 6 pairs,
    # 4 equal, kappa 1 - (1/12) / (1/4) = 2/3.
    # Bias: two pairs of the six one level lower, -2/6.
    assert cells(out, "visit level (0-2)") == ["6", "0", "66.7%", "0.667", "-0.333"]
    assert cells(out, "first visits") == ["6", "0", "66.7%", "0.667", "-0.333"]
    for label in ("snippet match (0/1)", "report rubric (0-4)", "citation joint (0-2)"):
        assert cells(out, label) == ["0", "0", "–", "–", "–"]
    # Marginals: the original 2, 2, 2 of 6 at levels 0, 1, 2; the audit judge 2, 4, 0.
    assert marginal_rows(out, "visit") == (["33.3%", "33.3%", "33.3%"], ["audit", "33.3%", "66.7%", "0.0%"])
    assert "Confusion matrices (rows: the original judge; columns: the audit judge)" in out
    matrix = out.split("\nvisit level (0-2)\n")[1].split("visit level, first visits")[0]
    assert "original \\ audit" in matrix and "original \\ people" not in out
    assert [cells(matrix, str(i)) for i in range(3)] == [["2", "0", "0"], ["0", "2", "0"], ["0", "2", "0"]]
    effect = doc["effect"]
    assert f"over {effect['turns']} non-final turns" in out and effect["turns"] == 3
    assert cells(out, "W1") == [f"{effect['w1']:.4f}", f"{effect['fused_w1']:.4f}"]
    assert cells(out, "RMSE") == [f"{effect['rmse']:.4f}", f"{effect['fused_rmse']:.4f}"]
    assert cells(out, "sign agreement") == [
        "66.7%",
        f"{100 * effect['fused_sign_agreement']:.1f}%",
    ]
    assert "outcome reward RMSE: n/a" in out
    usage = doc["usage"]
    assert f"audit judge usage: {usage['calls']} calls for {usage['judgments']} judgments" in out
    assert f"{usage['prompt_tokens']:,} prompt tokens" in out and usage["calls"] == 6
    shown = served.audit("show", audit_id.group(1), "--json")
    assert json.loads(shown.stdout) == doc


def test_start_without_wait_then_show_and_list(served: Served) -> None:
    started = served.audit("start", "--judge", "same", "--run", "exp", "--sample", "2", "--seed", "7", "--json")
    summary = started.document()
    assert summary["status"] == "queued" and summary["scope"] == {"run": "exp"} and summary["seed"] == 7
    assert len(summary["group_ids"]) == 2 and summary["sample_groups"] == 2
    again = served.audit("start", "--judge", "same", "--run", "exp", "--sample", "2", "--seed", "7")
    assert again.returncode == 0, again.stderr
    assert re.search(r"audit aud-[0-9a-f]+ queued: audit judge same \(judge-test\), run exp, 2 groups", again.stdout)
    assert "drcredit audit show aud-" in again.stderr
    shown = served.audit("show", summary["audit_id"], "--wait", "60", "--json")
    report = shown.document()
    assert report["group_ids"] == summary["group_ids"] and report["agreement"]["visit"]["kappa"] == 1.0
    listed = served.audit("list", "--run", "exp", "--json").document()
    assert listed == served.api("/v1/audits?run=exp")
    assert summary["audit_id"] in [a["audit_id"] for a in listed["audits"]]
    table = served.audit("list", "--run", "exp", COLUMNS="80")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(summary["audit_id"]))
    row, detail = lines[at], lines[at + 1]
    assert "done" in row and "kappa 1.000" in row and "sign 100.0%" in row
    assert detail.strip().startswith("same (judge-test) on run exp (")
    # Two lines an audit fit 80 columns (a table folded the judge and scope).
    assert max(len(line) for line in lines) <= 80, table.stdout
    assert served.audit("list", "--run", "nope").stdout.startswith("no audit yet")
    # Another tenant has none.
    assert served.audit("list", key="k2").stdout.startswith("no audit yet")


def test_the_report_fits_80_columns(served: Served) -> None:
    audit_id = served.audit("start", "--judge", "shifted", "--batch", "b1", "--json").document()["audit_id"]
    result = served.audit("show", audit_id, "--wait", "60", COLUMNS="80")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, result.stdout
    # 2 groups: twice the visit pairs of one.
    assert cells(result.stdout, "visit level (0-2)") == ["12", "0", "66.7%", "0.667", "-0.333"]


def test_errors_are_one_line_with_their_exit_code(served: Served) -> None:
    unknown_judge = served.audit("start", "--judge", "gpt-9", "--run", "exp")
    one_error_line(unknown_judge, 2, "judge: no audit judge named 'gpt-9' (known: down, same, shifted, slow)")
    one_error_line(
        served.audit("start", "--judge", "same"), 2, "give exactly one of --run, --batch, --group (got none)"
    )
    one_error_line(served.audit("start", "--judge", "same", "--run", "exp", "--batch", "b1"), 2, "got --run, --batch")
    one_error_line(served.audit("start", "--judge", "same", "--run", "nope"), 2, "run 'nope' not found")
    one_error_line(served.audit("start", "--judge", "same", "--group", "g0", "--group", "zz"), 2, "scope.group_ids[1]")
    one_error_line(served.audit("show", "aud-nope"), 2, "audit 'aud-nope' not found")
    one_error_line(served.audit("list", key="wrong"), 2, "missing or invalid API key")
    # The audit judge cannot be reached: the audit fails, with the reason.
    failed = served.audit("start", "--judge", "down", "--group", "g0", "--wait", "60")
    line = one_error_line(failed, 3, "is failed:", "unreachable", "outage deadline")
    assert failed.stdout == ""
    audit_id = re.search(r"audit '(aud-[0-9a-f]+)'", line)
    assert audit_id, line
    one_error_line(served.audit("show", audit_id.group(1)), 3, "is failed:", "unreachable")
    assert f"{audit_id.group(1)} failed: " in served.audit("list").stdout
    # Not done yet: said, with how to wait.
    slow_id = served.audit("start", "--judge", "slow", "--group", "g0", "--json").document()["audit_id"]
    one_error_line(served.audit("show", slow_id), 4, f"audit '{slow_id}' is", "not done yet", "--wait")
    one_error_line(served.audit("show", slow_id, "--wait", "0.3"), 4, f"audit '{slow_id}' not finished after 0.3s")
    assert served.audit("show", slow_id, "--wait", "inf", "--json").document()["status"] == "done"
    # The tenant's budget is used up: its own exit code, with when it resets (it was
    # 5, "unreachable", which sent people looking for an outage).
    one_error_line(
        served.audit("start", "--judge", "same", "--group", "g3", key="k3"), 6, "tokens_per_day", "resets at"
    )
    # No service there.
    gone = served.audit("list", DRCREDIT_URL=f"http://127.0.0.1:{free_port()}")
    one_error_line(gone, 5, "cannot reach the service", "Connection refused")
