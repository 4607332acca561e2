"""Input the contract does not allow: each answer names the field, in one error shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.api import api_client
from tests.support.scenarios import hand_worked_group


@pytest.fixture
def client(database_url: str) -> Iterator[TestClient]:
    with api_client(database_url, None) as c:
        yield c


def assert_error(response: Any, status: int, field: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) >= {"message", "detail"} and isinstance(body["message"], str)
    assert all(set(d) == {"field", "message"} for d in body["detail"])
    assert field in [d["field"] for d in body["detail"]], body
    return body  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda g: g["rollouts"][0].update(outcome_rewards=1.0), "rollouts[0].outcome_rewards"),
        (lambda g: g["rollouts"][0]["turns"][1].update(pagez=[]), "rollouts[0].turns[1].pagez"),
        (lambda g: g.update(paramz={"cap": 0.5}), "paramz"),
        (lambda g: g.update(extra_top_level=1), "extra_top_level"),
        (lambda g: g["rubrics"][0].update(wieght=2), "rubrics[0].wieght"),
        (lambda g: g["rollouts"][1]["turns"][0]["pages"][0].update(txt="x"), "rollouts[1].turns[0].pages[0].txt"),
        (lambda g: g["rollouts"][0]["turns"][0]["call"].update(query="q"), "rollouts[0].turns[0].call.query"),
        (lambda g: g["params"].update(bogus=1), "params.bogus"),
    ],
)
def test_unknown_fields_are_rejected_naming_their_path(client: TestClient, mutate: Any, field: str) -> None:
    doc = json.loads(json.dumps(hand_worked_group(params={"cap": 1.0})))  # shared rubric dicts stay intact
    mutate(doc)
    body = assert_error(client.post("/v1/groups", json=doc), 422, field)
    assert "unknown field" in body["message"]


def test_metadata_stays_free_json(client: TestClient) -> None:
    doc = hand_worked_group(metadata={"anything": [1, {"nested": True}], "run": "r1"})
    assert client.post("/v1/groups", json=doc).status_code == 202


def test_unknown_fields_in_a_batch_and_a_streamed_rollout(client: TestClient) -> None:
    doc = hand_worked_group(group_id="s1")
    r = client.post("/v1/batches", json={"groups": [doc], "batchid": "x"})
    assert_error(r, 422, "batchid")
    streaming = {**hand_worked_group(group_id="s2"), "expected_rollouts": 3}
    assert client.post("/v1/groups", json=streaming).status_code == 202
    extra = {**hand_worked_group()["rollouts"][0], "id": "r9", "reward": 1}
    assert_error(client.post("/v1/groups/s2/rollouts", json=extra), 422, "reward")


def test_a_body_that_is_not_json_says_so(client: TestClient) -> None:
    r = client.post("/v1/groups", content=b"question=q", headers={"content-type": "application/x-www-form-urlencoded"})
    body = assert_error(r, 415, "content-type")
    assert "application/json" in body["message"] and "x-www-form-urlencoded" in body["message"]


def test_malformed_json_names_line_and_column(client: TestClient) -> None:
    text = '{\n  "question": "q",\n  "rubrics": [,]\n}'
    r = client.post("/v1/groups", content=text.encode(), headers={"content-type": "application/json"})
    body = assert_error(r, 422, "body")
    assert "line 3, column 15" in body["message"], body["message"]


def test_an_oversized_chunked_body_is_413(database_url: str) -> None:
    with api_client(database_url, None, max_body_bytes=4096) as c:

        def chunks() -> Iterator[bytes]:
            for _ in range(10):
                yield b" " * 1000

        r = c.post("/v1/groups", content=chunks(), headers={"content-type": "application/json"})
        body = assert_error(r, 413, "body")
        assert "4096" in body["message"]


def test_authentication_comes_before_the_body(database_url: str) -> None:
    """A request without a valid key is 401 even when its body is invalid or too large."""
    with api_client(database_url, None, api_keys="acme:k1", max_body_bytes=4096) as c:
        assert_error(
            c.post("/v1/groups", content=b"{not json", headers={"content-type": "application/json"}),
            401,
            "authorization",
        )
        r = c.post("/v1/groups", content=b"x" * 10_000, headers={"content-type": "application/json"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        ok = c.post(
            "/v1/groups",
            content=b"{not json",
            headers={"content-type": "application/json", "authorization": "Bearer k1"},
        )
        assert_error(ok, 422, "body")


def test_a_conflicting_rollout_says_so(client: TestClient) -> None:
    streaming = {**hand_worked_group(group_id="s3"), "expected_rollouts": 3}
    assert client.post("/v1/groups", json=streaming).status_code == 202
    rollout = hand_worked_group()["rollouts"][0]
    changed = json.loads(json.dumps(rollout))
    changed["turns"][0]["reasoning"] = "other"
    assert_error(client.post("/v1/groups/s3/rollouts", json=changed), 409, "id")


def test_openapi_declares_the_bearer_scheme_and_each_endpoints_answers(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    schemes = spec["components"]["securitySchemes"]
    assert any(s.get("scheme") == "bearer" for s in schemes.values())
    post = spec["paths"]["/v1/groups"]["post"]
    assert post.get("security") and {"202", "401", "409", "413", "415", "422"} <= set(post["responses"])
    status = spec["paths"]["/v1/groups/{group_id}"]["get"]["responses"]
    assert {"200", "401", "404"} <= set(status) and "413" not in status and "415" not in status
    assert "413" not in spec["paths"]["/v1/groups/{group_id}/advantages"]["get"]["responses"]


def test_docs_work_offline(client: TestClient) -> None:
    """The Swagger page loads its assets from this service, not from a CDN."""
    page = client.get("/docs").text
    assert "cdn.jsdelivr.net" not in page and "unpkg.com" not in page
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        src = next(part for part in page.split('"') if part.endswith(asset))
        assert client.get(src).status_code == 200, src


def fresh_group(**extra: Any) -> dict[str, Any]:
    """The hand-worked group as independent JSON (its builders share rubric dicts)."""
    doc: dict[str, Any] = json.loads(json.dumps(hand_worked_group(**extra)))
    return doc


@pytest.mark.parametrize(
    ("turn", "message"),
    [
        ({"type": "browse", "reasoning": "r"}, "must be one of search, visit, answer, tool (got 'browse')"),
        ({"type": 5}, "must be one of search, visit, answer, tool (got 5)"),
        ({"reasoning": "no type"}, "field required: one of search, visit, answer, tool"),
    ],
)
def test_a_wrong_turn_type_is_named_on_its_type_field(client: TestClient, turn: Any, message: str) -> None:
    doc = fresh_group()
    doc["rollouts"][1]["turns"][2] = turn
    body = assert_error(client.post("/v1/groups", json=doc), 422, "rollouts[1].turns[2].type")
    assert body["detail"] == [{"field": "rollouts[1].turns[2].type", "message": message}]
    # The same words for a streamed rollout, relative to the rollout.
    streaming = {**fresh_group(group_id="s-type"), "expected_rollouts": 3}
    assert client.post("/v1/groups", json=streaming).status_code == 202
    extra = {**fresh_group()["rollouts"][0], "id": "r9"}
    extra["turns"][0] = turn
    body = assert_error(client.post("/v1/groups/s-type/rollouts", json=extra), 422, "turns[0].type")
    assert body["detail"] == [{"field": "turns[0].type", "message": message}]


def test_a_turn_that_is_not_an_object_says_so(client: TestClient) -> None:
    doc = fresh_group()
    doc["rollouts"][0]["turns"][1] = "visit"
    body = assert_error(client.post("/v1/groups", json=doc), 422, "rollouts[0].turns[1]")
    assert body["detail"][0]["message"] == "must be a JSON object (got the string 'visit')"


@pytest.mark.parametrize(
    ("content", "got"),
    [
        (b"", "an empty body"),
        (b"null", "null"),
        (b"[]", "an array"),
        (b"7", "the number 7"),
        (b'"g"', "the string 'g'"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/groups", "/v1/batches", "/v1/groups/g1/replay"])
def test_a_body_that_is_not_a_json_object_is_named_body(
    client: TestClient, path: str, content: bytes, got: str
) -> None:
    r = client.post(path, content=content, headers={"content-type": "application/json"})
    body = assert_error(r, 422, "body")
    assert body["detail"] == [{"field": "body", "message": f"must be a JSON object (got {got})"}]
    assert body["message"] == f"body: must be a JSON object (got {got})"


@pytest.mark.parametrize(
    "params",
    [{"cap": -1, "bogus": 1}, {"visit_levels": [0.5, 0.2, 0.1]}, {"attribution": "first", "discount": 2}],
)
def test_replay_and_sensitivity_name_parameters_as_a_posted_group_does(
    client: TestClient, params: dict[str, Any]
) -> None:
    """The same bad parameters give the same fields and messages (``params.NAME``) whether
    they come with a group, a replay of it, or a batch's sensitivity scenario."""
    posted = client.post("/v1/groups", json=fresh_group(group_id="p2", params=params))
    assert posted.status_code == 422, posted.text
    expected = posted.json()["detail"]
    assert expected and all(d["field"] == "params" or d["field"].startswith("params.") for d in expected)
    assert (
        client.post("/v1/batches", json={"batch_id": "pb", "groups": [fresh_group(group_id="p1")]}).status_code == 202
    )
    assert client.get("/v1/batches/pb/advantages", params={"wait": 60}).status_code == 200
    replayed = client.post("/v1/groups/p1/replay", json={"params": params})
    assert replayed.status_code == 422 and replayed.json()["detail"] == expected, replayed.text
    scenario = client.post("/v1/batches/pb/sensitivity", json={"params": params})
    assert scenario.status_code == 422 and scenario.json()["detail"] == expected, scenario.text
