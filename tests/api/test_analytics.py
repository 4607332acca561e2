"""Analytics endpoints (issue 14) on the hand-worked group, values computed by hand from docs/method.md.

The hand-worked group (tests/support/scenarios.py): rollout a's research turns are a
search with one snippet match (u = 0.1), a visit with levels R1 2, R2 1 (u = 0.5 + 0.2 =
0.7) and a visit that repeats its history (u = 0); rollout b's are a visit (u = 0.7) and
a search with two matches (u = 0.2); b's tool turn is not a research turn.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.api import api_client
from tests.support.builders import group_doc
from tests.support.judge_server import JudgeServer
from tests.support.scenarios import RUBRICS, hand_worked_group, rollout_a, rollout_b


@pytest.fixture
def client(database_url: str, marker_judge: JudgeServer) -> Any:
    with api_client(database_url, marker_judge.url) as c:
        yield c


def scored(client: TestClient, doc: dict[str, Any]) -> None:
    assert client.post("/v1/groups", json=doc).status_code == 202
    assert client.get(f"/v1/groups/{doc['group_id']}/advantages", params={"wait": 30}).status_code == 200


def test_group_evidence_proxy(client: TestClient) -> None:
    scored(client, hand_worked_group(group_id="g1"))
    r = client.get("/v1/groups/g1/evidence", params={"budgets": "1,2,4"})
    assert r.status_code == 200, r.text
    b1, b2, b4 = r.json()["points"]
    # b=1: C_a = 0.1, C_b = 0.7; rates the same over one turn.
    assert (b1["cumulative"], b1["rate"], b1["rollouts"]) == (pytest.approx(0.4), pytest.approx(0.4), 2)
    # b=2: C_a = 0.8, C_b = 0.9 -> 0.85; U = mean(0.8/2, 0.9/2) = 0.425
    assert (b2["cumulative"], b2["rate"]) == (pytest.approx(0.85), pytest.approx(0.425))
    # b=4: a has 3 research turns, b 2: C = 0.85; U = mean(0.8/3, 0.9/2)
    assert (b4["cumulative"], b4["rate"]) == (pytest.approx(0.85), pytest.approx((0.8 / 3 + 0.45) / 2))
    default = client.get("/v1/groups/g1/evidence").json()["points"]
    assert [p["budget"] for p in default] == [2, 4, 6, 8, 10, 12, 14]


def test_evidence_bad_budgets_name_the_field(client: TestClient) -> None:
    scored(client, hand_worked_group(group_id="g1"))
    for bad in ("0", "two", "1,,2"):
        r = client.get("/v1/groups/g1/evidence", params={"budgets": bad})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["field"] == "budgets"


def test_run_series_per_step(client: TestClient) -> None:
    scored(client, hand_worked_group(group_id="s1", metadata={"run": "exp", "step": 1}))
    scored(client, hand_worked_group(group_id="s2", metadata={"run": "exp", "step": 2}))
    scored(client, hand_worked_group(group_id="other", metadata={"run": "else", "step": 1}))
    runs = client.get("/v1/runs").json()["runs"]
    assert {r["run"]: (r["groups"], r["steps"]) for r in runs} == {"exp": (2, 2), "else": (1, 1)}
    doc = client.get("/v1/runs/exp", params={"budgets": "2"}).json()
    assert [s["step"] for s in doc["steps"]] == [1, 2]
    step = doc["steps"][0]
    assert (step["groups"], step["groups_done"], step["groups_failed"], step["trajectories"]) == (1, 1, 0, 2)
    # 3 judged visits x 2 positive rubrics + 2 snippet calls, over 2 trajectories
    assert step["judge_calls"]["process"] == 8 and step["judge_calls"]["process_per_trajectory"] == 4.0
    assert step["judge_calls"]["outcome"] == 0
    assert (step["failed_judgments"], step["unscorable_turns"]) == (0, 0)
    # non-final credits: a 0.8, 0.7, 0.0; b 0.7, 0.2, 0.0
    assert step["mean_credit"] == pytest.approx(0.4) and step["zero_credit_share"] == pytest.approx(2 / 6)
    assert step["evidence"][0]["cumulative"] == pytest.approx(0.85)
    adv = step["process_advantage"]
    assert adv["summary"]["count"] == 6 and sum(adv["counts"]) == 6
    assert step["latency_per_trajectory_s"]["count"] == 2 and step["latency_per_trajectory_s"]["min"] >= 0
    assert client.get("/v1/runs/nothing").status_code == 404


def test_run_metadata_types_are_checked(client: TestClient) -> None:
    for metadata, field in (({"run": 5}, "metadata.run"), ({"run": "x", "step": -1}, "metadata.step")):
        r = client.post("/v1/groups", json=hand_worked_group(group_id="bad", metadata=metadata))
        assert r.status_code == 422, r.text
        assert field in [d["field"] for d in r.json()["detail"]]


def z_scores(credits: list[float]) -> list[float]:
    mu = sum(credits) / len(credits)
    sigma = math.sqrt(sum((c - mu) ** 2 for c in credits) / len(credits))
    return [(c - mu) / sigma for c in credits]


def test_batch_sensitivity_pooled(client: TestClient) -> None:
    swapped = group_doc({**rollout_a(), "outcome_reward": 0.0}, {**rollout_b(), "outcome_reward": 1.0}, rubrics=RUBRICS)
    body = {"batch_id": "bt", "groups": [hand_worked_group(group_id="x1"), {**swapped, "group_id": "x2"}]}
    assert client.post("/v1/batches", json=body).status_code == 202
    assert client.get("/v1/batches/bt/advantages", params={"wait": 30}).status_code == 200
    r = client.post("/v1/batches/bt/sensitivity", json={"params": {"cap": 0.75}})
    assert r.status_code == 200, r.text
    got = r.json()
    # Under cap 0.75 only a's first search changes: min(0.75, 0.7 + 0.1) = 0.75.
    ref = z_scores([0.8, 0.7, 0.0, 0.7, 0.2, 0.0]) * 2
    new = z_scores([0.75, 0.7, 0.0, 0.7, 0.2, 0.0]) * 2
    w1 = sum(abs(x - y) for x, y in zip(sorted(ref), sorted(new), strict=True)) / 12
    rmse = math.sqrt(sum((x - y) ** 2 for x, y in zip(ref, new, strict=True)) / 12)
    s = got["sensitivity"]
    assert got["exact"] is True and got["groups"] == 2 and s["turns"] == 12
    assert s["wasserstein_1"] == pytest.approx(w1) and s["rmse"] == pytest.approx(rmse)
    assert s["process_sign_agreement"] == 1.0 and s["fused_sign_agreement"] == 1.0
    table = client.get("/v1/batches/bt/sensitivity").json()
    assert [row["name"] for row in table["scenarios"]][:2] == [
        "visit levels (0, 0.25, 0.5)",
        "visit levels (0, 0.2, 1.0)",
    ]
    cap = next(row for row in table["scenarios"] if row["name"] == "cap 0.75")
    assert cap["sensitivity"] == pytest.approx(s)


def test_analytics_are_tenant_scoped(database_url: str, marker_judge: JudgeServer) -> None:
    with api_client(database_url, marker_judge.url, api_keys="t1:k1,t2:k2") as c:
        c.headers["Authorization"] = "Bearer k1"
        scored(c, hand_worked_group(group_id="g1", metadata={"run": "mine", "step": 0}))
        c.headers["Authorization"] = "Bearer k2"
        assert c.get("/v1/runs").json()["runs"] == []
        assert c.get("/v1/runs/mine").status_code == 404
        assert c.get("/v1/groups/g1/evidence").status_code == 404
