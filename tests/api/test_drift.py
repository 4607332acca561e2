"""Drift over a run through the API (docs/method.md, "Drift over a run"): the judge's levels
per step in ``GET /v1/runs/{run}``, each step's drift from the run's first three steps, the
threshold as a query parameter and a setting, and the gauges ``/metrics`` exports.

Every group has one positive rubric R1 and two rollouts, each a visit whose page carries a
marker for R1's level (the marker judge answers it) and a report marked with R1's score,
judged with ``outcome_source: judge``. Per step, the visit levels (a, b) and report scores
(a, b) (tests/support/scenarios.py, ``DRIFT_GROUPS``):

    step 1: visits 2, 0   reports 4, 0
    step 2: visits 1, 2   reports 4, 2
    step 3: visits 0, 1   reports 0, 2
    -> baseline (pooled): visits counts (2, 2, 2), 1/3 each; reports counts (2, 0, 2, 0, 2)
    step 4: visits 2, 2   reports 4, 4
    -> visits (0, 0, 1): 0.5 * (1/3 + 1/3 + 2/3) = 2/3; reports (0, 0, 0, 0, 1): 2/3
    step 5: group x visits 0, 1, reports 0, 2; group y visits 2 and one the judge fails
            (an answer that is no verdict, every attempt), reports 4, 2
    -> visits 0, 1, 2 (the failed one left out): counts (1, 1, 1): drift 0 (had it counted
       as a 0, (2, 1, 1): 1/6, flagged); reports (1, 0, 2, 0, 1) / 4:
       0.5 * (1/12 + 0 + 1/6 + 0 + 1/12) = 1/6 > 0.15, flagged; not above 0.2.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, update

from drcredit.storage import models as m
from tests.support.api import api_client
from tests.support.judge_server import Call, JudgeServer, Reply, marker_answer, running_judge
from tests.support.scenarios import DRIFT_GROUPS as GROUPS
from tests.support.scenarios import FAIL


def failing_marker_script(call: Call) -> Reply:
    """The marker judge, failing every visit call whose page says :data:`FAIL`."""
    if call.kind == "visit" and any(FAIL in p["evidence"] for p in call.document["visit"]["pages"]):
        return Reply(content="no idea")
    return Reply.json(marker_answer(call))


@pytest.fixture
def judge() -> Iterator[JudgeServer]:
    with running_judge(failing_marker_script) as server:
        yield server


def score_run(client: TestClient) -> None:
    for doc in GROUPS:
        assert client.post("/v1/groups", json=doc).status_code == 202
    for doc in GROUPS:
        r = client.get(f"/v1/groups/{doc['group_id']}/advantages", params={"wait": 30})
        assert r.status_code == 200, r.text


def test_run_steps_carry_judge_levels_and_drift(database_url: str, judge: JudgeServer) -> None:
    with api_client(database_url, judge.url) as client:
        score_run(client)
        doc = client.get("/v1/runs/drifting").json()
    steps = {s["step"]: s for s in doc["steps"]}
    assert sorted(steps) == [1, 2, 3, 4, 5]
    # The failed judgment is counted as a failure, and not as a level.
    assert steps[5]["failed_judgments"] == 1
    assert steps[1]["judge_levels"]["visit"] == {"judgments": 2, "counts": [1, 0, 1], "shares": [0.5, 0.0, 0.5]}
    assert steps[1]["judge_levels"]["report_rubric"]["counts"] == [1, 0, 0, 0, 1]
    assert steps[5]["judge_levels"]["visit"]["counts"] == [1, 1, 1]
    assert steps[5]["judge_levels"]["report_rubric"]["counts"] == [1, 0, 2, 0, 1]
    for step in (1, 2, 3):
        assert steps[step]["drift"] == {k: {"value": None, "flagged": False} for k in ("visit", "report_rubric")}
    base = doc["drift_baseline"]
    assert (base["threshold"], base["steps"]) == (0.15, [1, 2, 3])
    assert base["judge_levels"]["visit"]["counts"] == [2, 2, 2]
    assert base["judge_levels"]["report_rubric"]["counts"] == [2, 0, 2, 0, 2]
    assert steps[4]["drift"]["visit"]["value"] == pytest.approx(2 / 3)
    assert steps[4]["drift"]["report_rubric"]["value"] == pytest.approx(2 / 3)
    assert steps[4]["drift"]["visit"]["flagged"] and steps[4]["drift"]["report_rubric"]["flagged"]
    assert steps[5]["drift"]["visit"] == {"value": 0.0, "flagged": False}
    assert steps[5]["drift"]["report_rubric"]["value"] == pytest.approx(1 / 6)
    assert steps[5]["drift"]["report_rubric"]["flagged"] is True


def test_drift_threshold_from_the_query_and_the_setting(database_url: str, judge: JudgeServer) -> None:
    with api_client(database_url, judge.url, drift_threshold=0.2) as client:
        score_run(client)
        setting = client.get("/v1/runs/drifting").json()
        query = client.get("/v1/runs/drifting", params={"drift_threshold": 0.1}).json()
        for bad in ("1.5", "-0.1", "high"):
            r = client.get("/v1/runs/drifting", params={"drift_threshold": bad})
            assert r.status_code == 422, r.text
            assert r.json()["detail"][0]["field"] == "query.drift_threshold", r.text
    # 1/6 is not above 0.2 (the setting), and is above 0.1 (the query).
    assert setting["drift_baseline"]["threshold"] == 0.2
    assert setting["steps"][4]["drift"]["report_rubric"]["flagged"] is False
    assert query["drift_baseline"]["threshold"] == 0.1
    assert query["steps"][4]["drift"]["report_rubric"]["flagged"] is True


def test_a_run_of_three_steps_has_levels_and_no_drift(database_url: str, judge: JudgeServer) -> None:
    with api_client(database_url, judge.url) as client:
        for doc in GROUPS[:3]:
            assert client.post("/v1/groups", json=doc).status_code == 202
            assert client.get(f"/v1/groups/{doc['group_id']}/advantages", params={"wait": 30}).status_code == 200
        doc = client.get("/v1/runs/drifting").json()
    assert doc["drift_baseline"] == {"threshold": 0.15, "steps": [], "judge_levels": None}
    assert [s["judge_levels"]["visit"]["counts"] for s in doc["steps"]] == [[1, 0, 1], [0, 1, 1], [1, 1, 0]]
    assert all(d == {"value": None, "flagged": False} for s in doc["steps"] for d in s["drift"].values())


def _samples(text: str, name: str) -> dict[tuple[str, str], float]:
    """(run, kind) -> value of each sample of ``name`` in Prometheus text."""
    out = {}
    for found in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1)))
        out[(labels["run"], labels["kind"])] = float(found.group(2))
    return out


def test_metrics_export_the_latest_finished_steps_drift(database_url: str, judge: JudgeServer) -> None:
    with api_client(database_url, judge.url) as client:
        score_run(client)
        text = client.get("/metrics").text
    # Step 5 is the latest finished step: visits 0, reports 1/6 (flagged).
    drift = _samples(text, "drcredit_run_drift")
    flagged = _samples(text, "drcredit_run_drift_flagged")
    assert drift[("drifting", "visit")] == 0.0
    assert drift[("drifting", "report_rubric")] == pytest.approx(1 / 6)
    assert flagged[("drifting", "visit")] == 0.0
    assert flagged[("drifting", "report_rubric")] == 1.0


def _value(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def test_metrics_count_steps_in_flight_and_groups_left_open(database_url: str, judge: JudgeServer) -> None:
    """Step 4's group made open again, with its work units' last end 10 minutes ago: one step
    in flight, one group left open after its judgments; the latest finished step is 5."""
    with api_client(database_url, judge.url) as client:
        score_run(client)
        first = client.get("/metrics").text
    assert _value(first, "drcredit_steps_in_flight") == 0
    assert _value(first, "drcredit_groups_judged_not_done") == 0
    seconds = re.search(r'^drcredit_run_latest_step_seconds\{run="drifting",tenant="[^"]*"\} (\S+)$', first, re.M)
    assert seconds and 0 <= float(seconds.group(1)) < 120
    engine = create_engine(database_url)
    with engine.begin() as conn:
        pk = conn.scalar(select(m.Group.id).where(m.Group.group_id == "s4"))
        conn.execute(update(m.Group).where(m.Group.id == pk).values(status="running"))
        old = datetime.now(UTC) - timedelta(minutes=10)
        conn.execute(update(m.WorkUnit).where(m.WorkUnit.group_pk == pk).values(updated_at=old))
    engine.dispose()
    with api_client(database_url, judge.url) as client:
        text = client.get("/metrics").text
    assert _value(text, "drcredit_steps_in_flight") == 1
    assert _value(text, "drcredit_groups_judged_not_done") == 1
