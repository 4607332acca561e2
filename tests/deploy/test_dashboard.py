"""The Grafana dashboard (deploy/grafana/dashboards/drcredit.json) and its provisioning.

No Grafana server runs here, so the dashboard's structure is checked against what
Grafana needs of a provisioned dashboard: a uid and title, panels with unique ids laid
out on the 24-column grid without overlapping, every panel reading the provisioned
Prometheus data source by its uid, targets with unique refIds and a PromQL expression
that Prometheus's own parser accepts (each expression is checked as a recording rule by
`promtool check rules`, the dashboard's variables replaced by values). The provisioning
files must point Grafana at the files compose mounts.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "drcredit.json"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "drcredit.yml"
COMPOSE = REPO / "docker-compose.yml"

#: What the dashboard's variables stand for when an expression is parsed.
VARIABLES = {"$__rate_interval": "5m", "$step_bound_s": "60"}

_DATASOURCE = {
    "type": "object",
    "required": ["type", "uid"],
    "properties": {"type": {"const": "prometheus"}, "uid": {"type": "string", "minLength": 1}},
}
_GRID = {
    "type": "object",
    "required": ["h", "w", "x", "y"],
    "properties": {
        "h": {"type": "integer", "minimum": 1},
        "w": {"type": "integer", "minimum": 1, "maximum": 24},
        "x": {"type": "integer", "minimum": 0, "maximum": 23},
        "y": {"type": "integer", "minimum": 0},
    },
}
#: The part of Grafana's dashboard model this dashboard uses, strictly.
SCHEMA = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "panels": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "type", "title", "gridPos"],
                "properties": {
                    "id": {"type": "integer"},
                    "type": {"enum": ["row", "timeseries", "stat"]},
                    "title": {"type": "string", "minLength": 1},
                    "gridPos": _GRID,
                },
                "if": {"properties": {"type": {"const": "row"}}},
                "then": {"required": ["panels", "collapsed"], "properties": {"panels": {"maxItems": 0}}},
                "else": {
                    "required": ["datasource", "targets", "description", "fieldConfig"],
                    "properties": {
                        "datasource": _DATASOURCE,
                        "description": {"type": "string", "minLength": 10},
                        "targets": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "required": ["refId", "expr", "datasource", "legendFormat"],
                                "additionalProperties": False,
                                "properties": {
                                    "refId": {"type": "string", "pattern": "^[A-Z]$"},
                                    "expr": {"type": "string", "minLength": 1},
                                    "datasource": _DATASOURCE,
                                    "legendFormat": {"type": "string"},
                                },
                            },
                        },
                    },
                },
            },
        },
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {
                "list": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "type"],
                        "properties": {"name": {"type": "string"}},
                    },
                }
            },
        },
    },
}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def graph_panels(doc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [p for p in (doc or dashboard())["panels"] if p["type"] != "row"]


def expressions(doc: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(panel title and refId, expression) of every target."""
    return [(f"{p['title']} {t['refId']}", t["expr"]) for p in graph_panels(doc) for t in p["targets"]]


def datasource_uid() -> str:
    (source,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    uid: str = source["uid"]
    return uid


def test_dashboard_matches_the_schema() -> None:
    jsonschema.validate(dashboard(), SCHEMA)


def test_schema_rejects_a_panel_without_a_datasource_or_expr() -> None:
    doc = dashboard()
    tampered = copy.deepcopy(doc)
    del graph_panels(tampered)[0]["datasource"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(tampered, SCHEMA)
    tampered = copy.deepcopy(doc)
    graph_panels(tampered)[0]["targets"][0]["expr"] = ""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(tampered, SCHEMA)


def test_panel_ids_unique_and_refids_unique_per_panel() -> None:
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))
    for p in graph_panels():
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]


def test_panels_fit_the_grid_without_overlapping() -> None:
    taken: dict[tuple[int, int], str] = {}
    for p in dashboard()["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, f"{p['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = p["title"]


def test_every_panel_reads_the_provisioned_prometheus() -> None:
    uid = datasource_uid()
    for p in graph_panels():
        assert p["datasource"] == {"type": "prometheus", "uid": uid}, p["title"]
        assert all(t["datasource"] == p["datasource"] for t in p["targets"]), p["title"]


def test_variables_used_are_defined() -> None:
    defined = {v["name"] for v in dashboard()["templating"]["list"]}
    for where, expr in expressions():
        for name in re.findall(r"\$(\w+)", expr):
            assert name.startswith("__") or name in defined, f"{where}: ${name} is not a variable of the dashboard"
            assert f"${name}" in VARIABLES, f"{where}: ${name} has no value for the parse check"


def _rules_file(tmp_path: Path, exprs: list[tuple[str, str]]) -> Path:
    def bound(expr: str) -> str:
        for name, value in VARIABLES.items():
            expr = expr.replace(name, value)
        return expr

    rules = [{"record": f"dashboard:target_{i}", "expr": bound(e)} for i, (_, e) in enumerate(exprs)]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return path


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: install Debian's prometheus package (scripts/test does)")
    return found


def test_every_expression_parses_as_promql(tmp_path: Path) -> None:
    exprs = expressions()
    path = _rules_file(tmp_path, exprs)
    done = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout


def test_the_parse_check_rejects_bad_promql(tmp_path: Path) -> None:
    path = _rules_file(tmp_path, [("bad", "sum by (queue (drcredit_queue_depth)")])
    done = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0


def test_provisioning_points_at_what_compose_mounts() -> None:
    grafana = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]
    mounts = {src: dst for src, dst, *_ in (v.split(":") for v in grafana["volumes"])}
    provisioning = mounts["./deploy/grafana/provisioning"]
    assert provisioning == "/etc/grafana/provisioning"
    (provider,) = yaml.safe_load(PROVIDERS.read_text())["providers"]
    assert provider["type"] == "file"
    assert mounts["./deploy/grafana/dashboards"] == provider["options"]["path"]
    (source,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    assert source["type"] == "prometheus"
    # The compose Prometheus, by service name and its port.
    assert source["url"] == "http://prometheus:9090"
    assert "9090:9090" in yaml.safe_load(COMPOSE.read_text())["services"]["prometheus"]["ports"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"
