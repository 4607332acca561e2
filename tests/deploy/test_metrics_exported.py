"""Every metric the dashboard's panels and the alert rules name is one the code exports.

Read from real processes: a `drcredit serve` API process (its `/metrics`) and a
`drcredit worker` process, which serves its metrics with prometheus_client's own HTTP
server on `DRCREDIT_METRICS_PORT` (`/metrics` on that port; a worker without the setting
serves none). A declared metric shows its `# TYPE` line before it has a sample, so a
series that no process has set yet (a tenant's, a run's) still counts as exported.

The gauges the API sets when it is scraped (groups, queues, steps, runs) must be in the
API's output with a sample; every other series is counted where the work runs, so it must
be in the worker's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from drcredit.storage.migrate import upgrade
from tests.support.infra import postgres_database
from tests.support.live import free_port
from tests.support.services import Workers, private_redis

pytestmark = pytest.mark.infra

REPO = Path(__file__).resolve().parents[2]
#: Set by the API from the database or the broker each time /metrics is read.
SET_BY_THE_API = {
    "drcredit_groups",
    "drcredit_queue_depth",
    "drcredit_queue_consumers",
    "drcredit_groups_waiting_for_consumer",
    "drcredit_steps_in_flight",
    "drcredit_groups_judged_not_done",
}
#: Also the API's, with samples only once there is something to count (a run, an ingest).
THE_APIS = SET_BY_THE_API | {
    "drcredit_groups_ingested_total",
    "drcredit_run_latest_step_seconds",
    "drcredit_run_drift",
    "drcredit_run_drift_flagged",
}
_SUFFIXES = ("_bucket", "_sum", "_count")


def named_metrics() -> dict[str, set[str]]:
    """Metric name -> where it is named (panel titles, alert names)."""
    found: dict[str, set[str]] = {}
    dashboard = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "drcredit.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            for name in re.findall(r"\bdrcredit_[a-z0-9_]+", target["expr"]):
                found.setdefault(name, set()).add(f"panel {panel['title']!r}")
    alerts = yaml.safe_load((REPO / "deploy" / "alerts.yml").read_text())
    for group in alerts["groups"]:
        for rule in group["rules"]:
            for name in re.findall(r"\bdrcredit_[a-z0-9_]+", rule["expr"]):
                found.setdefault(name, set()).add(f"alert {rule['alert']}")
    return found


def declared(text: str) -> dict[str, str]:
    """Name -> type of every ``# TYPE`` line (a histogram's series named as well)."""
    out = {}
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        out[name] = kind
        if kind == "histogram":
            out.update({name + suffix: kind for suffix in _SUFFIXES})
    return out


def _wait(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


@pytest.fixture
def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DRCREDIT_")}


@pytest.fixture
def api_metrics(tmp_path: Path, clean_env: dict[str, str]) -> Iterator[str]:
    """The /metrics text of a `drcredit serve` process (embedded database, offline judge)."""
    port = free_port()
    log = tmp_path / "api.log"
    env = {**clean_env, "DRCREDIT_DATA_DIR": str(tmp_path / "data"), "DRCREDIT_LOG_LEVEL": "WARNING"}
    cli = [sys.executable, "-m", "drcredit_cli.main", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(cli, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait(f"http://127.0.0.1:{port}/healthz", process, log)
        yield httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    finally:
        process.terminate()
        process.wait(30)


@pytest.fixture
def worker_metrics(tmp_path: Path, clean_env: dict[str, str]) -> Iterator[str]:
    """The metrics text of a `drcredit worker` process on its DRCREDIT_METRICS_PORT."""
    port = free_port()
    with postgres_database("drcredit_metrics") as db, private_redis() as broker:
        upgrade(db)
        env = {
            **clean_env,
            "DRCREDIT_DATABASE_URL": db,
            "DRCREDIT_BROKER_URL": broker.url,
            "DRCREDIT_JUDGE": "offline",
            "DRCREDIT_METRICS_PORT": str(port),
        }
        workers = Workers(env, tmp_path)
        try:
            workers.start("credit_aggregator", 1)
            yield httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        finally:
            workers.stop_all()


def test_every_metric_a_panel_or_rule_names_is_exported(api_metrics: str, worker_metrics: str) -> None:
    named = named_metrics()
    api, worker = declared(api_metrics), declared(worker_metrics)
    # The dashboard and the rules name what the operator watches: at least these.
    assert {"drcredit_run_drift", "drcredit_judge_endpoint_limit", "drcredit_tenant_judge_cost_usd_total"} <= set(named)
    missing = {name: sorted(where) for name, where in named.items() if name not in api and name not in worker}
    assert not missing, f"named but exported by no process: {missing}"
    for name, where in named.items():
        source = api if name in THE_APIS else worker
        assert name in source, f"{name} ({sorted(where)}) not in the {'API' if source is api else 'worker'}'s /metrics"


def test_the_api_sets_its_gauges_when_scraped(api_metrics: str) -> None:
    for name in SET_BY_THE_API - {
        "drcredit_queue_depth",
        "drcredit_queue_consumers",
        "drcredit_groups_waiting_for_consumer",
    }:
        assert re.search(rf"^{name}(\{{[^}}]*\}})? \S+$", api_metrics, re.M), f"{name} has no sample"
