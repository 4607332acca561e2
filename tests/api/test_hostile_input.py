"""Input built to break the service answers a 4xx naming the field, never a 500."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.test_bad_input import assert_error
from tests.support.api import api_client
from tests.support.judge_server import Reply, running_judge
from tests.support.scenarios import hand_worked_group


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    with api_client(database_url, None) as c:
        yield c


def post_raw(client: TestClient, doc: dict[str, Any], text: str | None = None) -> Any:
    body = text if text is not None else json.dumps(doc)
    return client.post("/v1/groups", content=body.encode(), headers={"content-type": "application/json"})


def fresh() -> dict[str, Any]:
    return json.loads(json.dumps(hand_worked_group()))


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize(
    ("where", "field"),
    [
        (lambda g: g.update(question="q \ud800 x"), "question"),
        (
            lambda g: g["rollouts"][0]["turns"][1]["pages"][0].update(evidence="e \udfff"),
            "rollouts[0].turns[1].pages[0].evidence",
        ),
        (lambda g: g["rubrics"][0]["trusted_evidence"].append("\ud83d"), "rubrics[0].trusted_evidence[0]"),
        (lambda g: g.update(question="a\x00b"), "question"),
        (lambda g: g["rubrics"][0].update(id="R\x001"), "rubrics[0].id"),
        (lambda g: g["rollouts"][1].update(id="b\x00"), "rollouts[1].id"),
    ],
)
def test_text_that_cannot_be_stored_is_a_422(client: TestClient, where: Any, field: str) -> None:
    doc = fresh()
    where(doc)
    body = assert_error(post_raw(client, doc), 422, field)
    assert "surrogate" in body["message"] or "NUL" in body["message"]


def test_a_valid_surrogate_pair_is_fine(client: TestClient) -> None:
    doc = fresh()
    doc["question"] = "emoji \ud83d\ude00 ok"
    assert post_raw(client, doc).status_code == 202


@pytest.mark.parametrize("path", ["metadata", "rollouts[1].turns[2].arguments"])
def test_json_nested_past_the_limit_is_a_422(client: TestClient, path: str) -> None:
    doc = fresh()
    if path == "metadata":
        doc["metadata"] = nested(256)
    else:
        doc["rollouts"][1]["turns"][2]["arguments"] = nested(256)
    body = assert_error(post_raw(client, doc), 422, path)
    assert "deeper than 32" in body["message"]
    doc = fresh()
    doc["metadata"] = nested(30)
    assert post_raw(client, doc).status_code == 202


def test_an_integer_that_does_not_fit_a_float_is_a_422(client: TestClient) -> None:
    text = json.dumps(fresh()).replace('"outcome_reward": 1.0', '"outcome_reward": ' + "9" * 400, 1)
    body = assert_error(post_raw(client, {}, text), 422, "rollouts[0].outcome_reward")
    assert "400-digit" in body["message"]
    doc = fresh()
    doc["metadata"] = {"n": 10**30}
    assert_error(post_raw(client, doc), 422, "metadata")


@pytest.mark.parametrize("path", ["/v1/groups/a%00b", "/v1/groups/a%00b/advantages", "/v1/batches/%00"])
def test_a_path_id_the_service_could_never_have_given_is_a_404(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404 and r.json()["detail"][0]["field"] in ("group_id", "batch_id")
    assert client.post("/v1/groups/a%00b/rollouts", json=fresh()["rollouts"][0]).status_code == 404


def test_limits_are_422s_naming_the_field_and_the_setting(database_url: str) -> None:
    limits = {"max_rubrics": 2, "max_rollouts": 3, "max_turns": 3, "max_items": 1, "max_text_chars": 50}
    with api_client(database_url, None, **limits) as c:
        doc = fresh()
        assert_error(post_raw(c, doc), 422, "rubrics")  # three rubrics
        doc["rubrics"] = doc["rubrics"][:2]
        doc["question"] = "x" * 51
        doc["rollouts"].append({**doc["rollouts"][1], "id": "c"})
        doc["rollouts"].append({**doc["rollouts"][1], "id": "d"})
        body = c.post("/v1/groups", json=doc).json()
        fields = {d["field"] for d in body["detail"]}
        assert {"question", "rollouts", "rollouts[0].turns", "rollouts[1].turns[1].results"} <= fields, fields
        assert "DRCREDIT_MAX_ROLLOUTS" in body["message"] and "DRCREDIT_MAX_TEXT_CHARS" in body["message"]
        batch = c.post("/v1/batches", json={"groups": [fresh()]})
        assert_error(batch, 422, "groups[0].rubrics")
        stream = {**fresh(), "rubrics": fresh()["rubrics"][:2], "rollouts": [], "expected_rollouts": 3}
        stream["group_id"] = "s1"
        assert c.post("/v1/groups", json=stream).status_code == 202
        assert_error(c.post("/v1/groups/s1/rollouts", json=fresh()["rollouts"][0]), 422, "turns")


def test_a_failed_group_can_be_inspected(database_url: str) -> None:
    """Policy fail: the group fails on its first failed judgment; /credits still answers
    with what was judged and why the group failed."""
    with running_judge(lambda c: Reply(content="not json")) as judge, api_client(database_url, judge.url) as c:
        doc = {**fresh(), "group_id": "bad", "params": {"on_judge_failure": "fail"}}
        assert c.post("/v1/groups", json=doc).status_code == 202
        r = c.get("/v1/groups/bad/credits", params={"wait": 30})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "failed" and "judgment failed" in body["error"]
    judgments = [j for ro in body["rollouts"] for t in ro["turns"] for j in t["judgments"]]
    assert any(j["status"] == "failed" and "invalid" in j["failure_reason"] for j in judgments)
