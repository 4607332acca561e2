"""``drcredit labels`` and ``drcredit audit start --judge human`` as subprocesses against a
served API (SQLite, the marker judge): JSON Lines out and in (one bad line stores
nothing and is named by its number), and the audit against the labels as tables."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from drcredit_api.app import create_app
from tests.api.test_labels import three_rollouts
from tests.support.api import settings_for
from tests.support.judge_server import marker_script, running_judge
from tests.support.live import serving
from tests.test_cli import Run, run
from tests.test_cli_audit import cells, marginal_rows
from tests.test_cli_failures import one_error_line


class Served(NamedTuple):
    url: str
    data: Path

    def cli(self, *args: str, key: str = "k1", **env: str) -> Run:
        return run(self.data, *args, env={"DRCREDIT_URL": self.url, "DRCREDIT_API_KEY": key, **env})

    def labels(self, key: str = "k1") -> list[dict[str, Any]]:
        r = httpx.get(self.url + "/v1/labels", headers={"Authorization": f"Bearer {key}"}, timeout=60)
        assert r.status_code == 200, r.text
        labels: list[dict[str, Any]] = r.json()["labels"]
        return labels


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    base = tmp_path_factory.mktemp("cli-labels")
    with running_judge(marker_script) as judge:
        settings = settings_for(f"sqlite:///{base / 'api.sqlite3'}", judge.url, api_keys="t1:k1,t2:k2")
        with serving(create_app(settings)) as url:
            with httpx.Client(base_url=url, headers={"Authorization": "Bearer k1"}, timeout=60) as c:
                assert c.post("/v1/groups", json=three_rollouts()).status_code == 202
                assert c.get("/v1/groups/g0/advantages", params={"wait": 60}).status_code == 200
            yield Served(url, base / "cli")


def line(rollout_id: str, rubric_id: str, value: Any, labeler: str | None = "ann") -> str:
    doc: dict[str, Any] = {
        "group_id": "g0",
        "kind": "visit",
        "key": {"rollout_id": rollout_id, "turn_index": 0, "rubric_id": rubric_id},
        "value": value,
    }
    if labeler is not None:
        doc["labeler"] = labeler
    return json.dumps(doc)


def test_an_import_with_a_bad_line_stores_nothing_and_names_the_line(served: Served, tmp_path: Path) -> None:
    # The served database is the module's: another test may have stored labels already
    # (in any order), so "nothing stored" is "the labels, with their times, unchanged".
    before = served.labels()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([line("a", "R1", 1), "", line("b", "R1", 7), line("zz", "R1", 1)]) + "\n")
    result = served.cli("labels", "import", str(bad))
    one_error_line(
        result, 2, "line 3: value: a visit label is a whole number 0..2, got 7", "line 4: key:", "nothing was stored"
    )
    assert served.labels() == before
    broken = tmp_path / "broken.jsonl"
    broken.write_text(line("a", "R1", 1) + "\n{not json\n")
    one_error_line(served.cli("labels", "import", str(broken)), 2, "line 2: not JSON")
    extra = tmp_path / "extra.jsonl"
    extra.write_text(line("a", "R1", 1)[:-1] + ', "confidence": 0.9}\n')
    one_error_line(served.cli("labels", "import", str(extra)), 2, "line 1: confidence: unknown field")
    assert served.labels() == before


def test_export_then_import_round_trips_and_an_audit_against_the_labels_prints_tables(
    served: Served, tmp_path: Path
) -> None:
    # The marker judge's levels: a-R1 2, a-R2 1, b-R1 1, b-R2 0, c-R1 2, c-R2 0.
    good = tmp_path / "good.jsonl"
    rows = [
        line("a", "R1", 1, None),
        line("a", "R2", 1, None),
        line("b", "R1", 1, None),
        line("a", "R1", 2, "ben"),
        line("b", "R1", 0, "ben"),
    ]
    good.write_text("\n".join(rows) + "\n")
    result = served.cli("labels", "import", str(good), "--labeler", "ann")
    assert result.returncode == 0, result.stderr
    assert "stored 5 labels (0 replaced an earlier one)" in result.stdout
    exported = served.cli("labels", "export")
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(x) for x in exported.stdout.splitlines()]
    assert lines == served.labels() and len(lines) == 5
    only_ben = served.cli("labels", "export", "--labeler", "ben", "--group", "g0", "--out", str(tmp_path / "ben.jsonl"))
    assert only_ben.returncode == 0 and "wrote 2 labels" in only_ben.stderr
    # The export imports again as it is: every label replaces itself.
    out_file = tmp_path / "all.jsonl"
    out_file.write_text(exported.stdout)
    reimported = served.cli("labels", "import", str(out_file))
    assert "stored 5 labels (5 replaced an earlier one)" in reimported.stdout, reimported.stderr
    assert [(x["item_id"], x["labeler"], x["value"]) for x in served.labels()] == [
        (x["item_id"], x["labeler"], x["value"]) for x in lines
    ]
    # Another tenant has none.
    assert served.cli("labels", "export", key="k2").stdout == ""
    report = served.cli("audit", "start", "--judge", "human", "--group", "g0")
    assert report.returncode == 0, report.stderr
    out = report.stdout
    assert "the original judge against people's labels, groups g0, 1 labeled group" in out
    # Per key, the lower median: a-R1 (1, 2) -> 1; a-R2 1; b-R1 (0, 1) -> 0.
    # Pairs (judge, people): (2, 1), (1, 1), (1, 0): 1 of 3 equal, bias -2/3.
    # O: (1,0) 1/3, (1,1) 1/3, (2,1) 1/3; sum w O = 2 * 1/4 * 1/3 = 1/6. Rows (0, 2/3, 1/3),
    # columns (1/3, 2/3, 0): sum w E = 1/4 (2/3 * 1/3) + 1 (1/3 * 1/3) + 1/4 (1/3 * 2/3) = 2/9.
    kappa = 1 - (1 / 6) / (2 / 9)
    assert cells(out, "visit level (0-2)") == ["3", "0", "33.3%", f"{kappa:.3f}", "-0.667"]
    assert marginal_rows(out, "visit") == (["0.0%", "66.7%", "33.3%"], ["people", "33.3%", "66.7%", "0.0%"])
    assert "labels by: ann 3, ben 2" in out
    # The confusion matrix's columns are people, as its heading says.
    assert "columns: people)" in out and "original \\ people" in out and "original \\ audit" not in out
    # ann against ben on a-R1 (1, 2) and b-R1 (1, 0): exact 0, bias 0.
    assert cells(out, "ann / ben") == ["visit", "level", "(0-2)", "2", "0.0%", "0.000", "+0.000"]
    assert "no effect on the advantages" in out
    one_error_line(
        served.cli("audit", "start", "--judge", "human", "--group", "g0", "--labeler", "zed"),
        2,
        "labelers[0]: no label by 'zed' in this scope",
    )
