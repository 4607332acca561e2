"""Every endpoint of the REST API (docs/api.md) against the real app, on SQLite and on Postgres.

The judge is the scripted OpenAI-compatible server (``marker_answer``), so the expected
credits below follow from the markers in the page and snippet text by the method's rules (docs/method.md).
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.api import api_client
from tests.support.builders import answer, group_doc, page, rollout, rubric, search, visit
from tests.support.judge_server import JudgeServer, Reply, running_judge
from tests.support.scenarios import CREDITS, hand_worked_group


def small_group(group_id: str = "g1", **extra: Any) -> dict[str, Any]:
    """The hand-worked group (see tests/support/scenarios.py) under ``group_id``."""
    return hand_worked_group(group_id=group_id, **extra)


def expected_advantages() -> dict[str, list[float]]:
    pooled = [0.8, 0.7, 0.0, 0.7, 0.2, 0.0]
    mu = sum(pooled) / 6
    sigma = math.sqrt(sum((c - mu) ** 2 for c in pooled) / 6)
    a_o = 1 / math.sqrt(2)  # rewards (1, 0): sample std sqrt(0.5)
    return {
        "a": [a_o + (c - mu) / sigma for c in (0.8, 0.7, 0.0)] + [a_o],
        "b": [-a_o + (c - mu) / sigma for c in (0.7, 0.2, 0.0)],
    }


@pytest.fixture
def client(database_url: str, marker_judge: JudgeServer) -> Any:
    with api_client(database_url, marker_judge.url) as c:
        yield c


def post_and_wait(client: TestClient, doc: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/groups", json=doc)
    assert r.status_code == 202, r.text
    r = client.get(f"/v1/groups/{r.json()['group_id']}/advantages", params={"wait": 30})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_group_scoring_end_to_end(client: TestClient, marker_judge: JudgeServer) -> None:
    r = client.post("/v1/groups", json=small_group(metadata={"run": "r7", "step": 42}))
    assert r.status_code == 202
    body = r.json()
    assert body["group_id"] == "g1" and body["status"] == "queued" and body["created"] is True
    doc = client.get("/v1/groups/g1/advantages", params={"wait": 30}).json()
    assert doc["status"] == "done" and doc["metadata"] == {"run": "r7", "step": 42}
    assert doc["params"]["cap"] == 1.0 and doc["params"]["visit_levels"] == [0.0, 0.2, 0.5]
    expected = expected_advantages()
    for ro in doc["rollouts"]:
        assert [t["index"] for t in ro["turns"]] == list(range(len(ro["turns"])))
        assert [t["credit"] for t in ro["turns"]] == [
            pytest.approx(c) if c is not None else None for c in CREDITS[ro["id"]]
        ]
        assert [t["advantage"] for t in ro["turns"]] == [pytest.approx(x) for x in expected[ro["id"]]]
    final = doc["rollouts"][0]["turns"][-1]
    assert final["type"] == "answer" and final["credit"] is None and final["process_advantage"] is None
    assert final["advantage"] == doc["rollouts"][0]["outcome_advantage"]
    assert doc["stats"]["mu_rg"] == pytest.approx(0.4) and doc["stats"]["sigma_o"] == pytest.approx(math.sqrt(0.5))
    # 3 judged visits x 2 positive rubrics + 2 snippet calls; the penalty rubric costs nothing.
    assert marker_judge.count("visit") == 6 and marker_judge.count("snippet") == 2
    status = client.get("/v1/groups/g1").json()
    assert status["progress"] == {
        "judgments_total": 8,
        "judgments_done": 8,
        "judgments_failed": 0,
        "judge_calls": 8,
        "cache_hits": 0,
        "deterministic_zeros": 0,
        "snippet_calls_skipped": 0,
    }
    assert status["finished_at"] is not None and status["judge"]["model"] == "judge-test"


def test_every_link_of_the_post_answer_leads_somewhere(client: TestClient) -> None:
    """The answer's links are the group's paths, its page in the credit viewer included."""
    doc = small_group("g-links", expected_rollouts=2)
    second = doc["rollouts"].pop()
    links = client.post("/v1/groups", json=doc).json()["links"]
    base = "/v1/groups/g-links"
    assert links == {
        "status": base,
        "advantages": f"{base}/advantages",
        "credits": f"{base}/credits",
        "rollouts": f"{base}/rollouts",
        "viewer": "/ui/groups/g-links",
    }
    streamed = client.post(links["rollouts"], json=second)
    assert streamed.status_code == 202 and streamed.json()["created"] is True
    assert client.get(links["advantages"], params={"wait": 30}).status_code == 200
    assert client.get(links["status"]).json()["status"] == "done"
    assert client.get(links["credits"]).status_code == 200
    page = client.get(links["viewer"])
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<code id="group-name" data-text>g-links</code>' in page.text


def test_idempotent_repost_and_conflict(client: TestClient, marker_judge: JudgeServer) -> None:
    post_and_wait(client, small_group())
    calls = marker_judge.count()
    again = client.post("/v1/groups", json=small_group(metadata={"different": "metadata is not scored"}))
    assert again.status_code == 202 and again.json()["created"] is False and again.json()["status"] == "done"
    assert marker_judge.count() == calls
    changed = small_group(params={"cap": 0.5})
    r = client.post("/v1/groups", json=changed)
    assert r.status_code == 409 and "different content" in r.json()["message"]
    assert r.json()["detail"] == [{"field": "params", "message": "differ in cap"}]
    other = small_group()
    other["rollouts"][1]["turns"][0]["reasoning"] = "changed"
    other["question"] = "another question"
    r = client.post("/v1/groups", json=other)
    assert r.status_code == 409
    assert [d["field"] for d in r.json()["detail"]] == ["question", "rollouts[1]"]


def test_group_id_is_generated_when_absent(client: TestClient) -> None:
    doc = small_group()
    del doc["group_id"]
    r = client.post("/v1/groups", json=doc)
    assert r.status_code == 202 and len(r.json()["group_id"]) == 32


def test_validation_errors_name_the_field(client: TestClient) -> None:
    doc = small_group()
    doc["rollouts"][1]["turns"][0]["pages"].append(page("W1", "https://x.org"))
    r = client.post("/v1/groups", json=doc)
    assert r.status_code == 422
    assert r.json()["detail"] == [
        {"field": "rollouts[1].turns[0].pages[1].id", "message": "duplicate page id W1 (first at turns[0].pages[0].id)"}
    ]
    assert "rollouts[1].turns[0].pages[1].id" in r.json()["message"]
    r = client.post("/v1/groups", json=small_group(params={"bogus": 1}))
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "params.bogus"
    r = client.post("/v1/groups", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "body"
    r = client.post(
        "/v1/groups",
        content=b'{"question": "q", "rubrics": [], "rollouts": []}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "rubrics"
    nan = small_group()
    text = client.app.__class__  # keep the linter quiet about unused names below
    del text
    body = str(nan).replace("'", '"').replace("None", "null").replace("True", "true").replace("False", "false")
    body = body.replace('"outcome_reward": 1.0', '"outcome_reward": NaN')
    r = client.post("/v1/groups", content=body.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "rollouts[0].outcome_reward"


def test_oversized_body_is_413(database_url: str, marker_judge: JudgeServer) -> None:
    with api_client(database_url, marker_judge.url, max_body_bytes=2048) as c:
        r = c.post("/v1/groups", json=small_group(question="x" * 5000))
        assert r.status_code == 413 and "2048" in r.json()["message"]
        assert r.json()["detail"][0]["field"] == "body"
        assert c.post("/v1/groups", json=small_group()).status_code == 202


def test_tenant_isolation(database_url: str, marker_judge: JudgeServer) -> None:
    with api_client(database_url, marker_judge.url, api_keys="acme:key-a, globex:key-g") as c:
        assert c.post("/v1/groups", json=small_group()).status_code == 401
        assert c.post("/v1/groups", json=small_group(), headers={"Authorization": "Bearer nope"}).status_code == 401
        a = {"Authorization": "Bearer key-a"}
        g = {"Authorization": "Bearer key-g"}
        assert c.post("/v1/groups", json=small_group(), headers=a).status_code == 202
        assert c.get("/v1/groups/g1/advantages", params={"wait": 30}, headers=a).status_code == 200
        for path in ("/v1/groups/g1", "/v1/groups/g1/advantages", "/v1/groups/g1/credits"):
            r = c.get(path, headers=g)
            assert r.status_code == 404 and r.json()["message"] == "group 'g1' not found"
            assert r.json()["detail"] == [{"field": "group_id", "message": "group 'g1' not found"}]
        assert c.post("/v1/groups/g1/replay", json={"params": {}}, headers=g).status_code == 404
        # The same group id is free for another tenant.
        assert c.post("/v1/groups", json=small_group(params={"cap": 0.5}), headers=g).json()["created"] is True
        assert (
            c.post("/v1/batches", json={"batch_id": "b1", "groups": [small_group("g2")]}, headers=a).status_code == 202
        )
        assert c.get("/v1/batches/b1/advantages", headers=g).status_code == 404
        assert c.get("/healthz").status_code == 200


def test_not_done_is_409_with_status(database_url: str) -> None:
    with (
        running_judge(
            lambda call: Reply.json(
                {"matches": []} if call.kind == "snippet" else {"level": 0, "page_ids": [], "support_points": []},
                delay=1.0,
            )
        ) as slow,
        api_client(database_url, slow.url) as c,
    ):
        c.post("/v1/groups", json=small_group())
        r = c.get("/v1/groups/g1/advantages")
        assert r.status_code == 409 and r.json()["status"] in ("queued", "running")
        assert c.get("/v1/groups/g1/credits").status_code == 409
        assert c.get("/v1/groups/g1/advantages", params={"wait": 30}).status_code == 200


def test_unknown_group_is_404(client: TestClient) -> None:
    assert client.get("/v1/groups/nope").status_code == 404
    assert client.get("/v1/batches/nope/advantages").status_code == 404
    assert client.post("/v1/groups/nope/rollouts", json=rollout("x", answer())).status_code == 404


def test_credits_breakdown(client: TestClient) -> None:
    post_and_wait(client, small_group())
    doc = client.get("/v1/groups/g1/credits").json()
    a = doc["rollouts"][0]
    search_turn, first_visit, second_visit = a["turns"][0], a["turns"][1], a["turns"][2]
    assert search_turn["navigation_credit"] == pytest.approx(0.7) and search_turn["snippet_matches"] == 1
    assert search_turn["judgments"][0]["matches"] == [{"rubric_id": "R2", "result_id": "S2", "evidence_quote": "[R2]"}]
    assert first_visit["visit_credit_uncapped"] == pytest.approx(0.7)
    levels = {j["rubric_id"]: j["level"] for j in first_visit["judgments"]}
    assert levels == {"R1": 2, "R2": 1}
    assert {j["rubric_id"]: j["prior_support_points"] for j in second_visit["judgments"]} == {"R1": 1, "R2": 1}
    assert a["support_histories"] == {"R1": [{"turn_index": 1, "text": "f1"}], "R2": [{"turn_index": 1, "text": "g1"}]}
    judgment = first_visit["judgments"][0]
    assert (
        judgment["status"] == "ok" and judgment["attempts"][0]["outcome"] == "ok" and judgment["model"] == "judge-test"
    )


def test_replay_recomputes_without_judge_calls(client: TestClient, marker_judge: JudgeServer) -> None:
    reference = post_and_wait(client, small_group())
    calls = marker_judge.count()
    same = client.post("/v1/groups/g1/replay", json={"params": {}}).json()
    assert same["exact"] is True and same["sensitivity"]["rmse"] == 0 and same["sensitivity"]["wasserstein_1"] == 0
    assert same["sensitivity"]["process_sign_agreement"] == 1.0
    assert [t["advantage"] for t in same["rollouts"][0]["turns"]] == [
        t["advantage"] for t in reference["rollouts"][0]["turns"]
    ]
    other = client.post(
        "/v1/groups/g1/replay", json={"params": {"visit_levels": [0, 0.25, 0.5], "snippet_weight": 0.3}}
    ).json()
    # a: t0 = 0.75 + 0.3 = 1.05 -> cap 1; t1 = 0.75; b: t0 = 0.75, t1 = 0.6.
    assert [t["credit"] for t in other["rollouts"][0]["turns"]] == [1.0, 0.75, 0.0, None]
    assert [t["credit"] for t in other["rollouts"][1]["turns"]] == [0.75, pytest.approx(0.6), 0.0]
    assert other["exact"] is True and other["sensitivity"]["turns"] == 6 and other["sensitivity"]["rmse"] > 0
    assert marker_judge.count() == calls
    r = client.post("/v1/groups/g1/replay", json={"params": {"history": False}})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "params.history"
    assert client.post("/v1/groups/g1/replay", json={"params": {"cap": -1}}).status_code == 422


def test_replay_reports_turns_bounded_by_skipped_snippet_calls(client: TestClient) -> None:
    """b's search gets no navigation; a saturated search (visit credit 1.0) skipped its call."""
    doc = group_doc(
        rollout(
            "a",
            search(("S1", "https://u1.org/p"), ("S2", "https://n1.org/p", "[R1]")),
            visit(page("W1", "https://u1.org/p", "[R1:2:f1] [R2:2:g1] [X:1:z]")),
            reward=1.0,
        ),
        rollout("b", visit(page("W1", "https://u9.org/p", "[R2:1:g2]")), reward=0.0),
        rubrics=[rubric("R1"), rubric("R2")],
        group_id="sat",
    )
    post_and_wait(client, doc)
    status = client.get("/v1/groups/sat").json()
    assert status["progress"]["snippet_calls_skipped"] == 1
    out = client.post("/v1/groups/sat/replay", json={"params": {"cap": 1.25}}).json()
    assert out["exact"] is False and out["bounded_turns"] == [{"rollout_id": "a", "index": 0}]
    turn = out["rollouts"][0]["turns"][0]
    # Navigation 1.0 < cap 1.25: between 0 and 2 matches (2 positive rubrics) -> [1.0, 1.2].
    assert turn["credit"] == 1.0 and turn["credit_upper_bound"] == pytest.approx(1.2)


def test_batches(client: TestClient, marker_judge: JudgeServer) -> None:
    body = {"batch_id": "step-1", "groups": [small_group("q1"), small_group("q2", params={"cap": 0.5})]}
    r = client.post("/v1/batches", json=body)
    assert r.status_code == 202 and r.json()["batch_id"] == "step-1" and r.json()["group_ids"] == ["q1", "q2"]
    doc = client.get("/v1/batches/step-1/advantages", params={"wait": 30}).json()
    assert doc["status"] == "done" and [g["group_id"] for g in doc["groups"]] == ["q1", "q2"]
    assert doc["groups"][1]["params"]["cap"] == 0.5
    assert client.get("/v1/batches/step-1").json()["groups"][0]["status"] == "done"
    calls = marker_judge.count()
    again = client.post("/v1/batches", json=body)
    assert again.status_code == 202 and again.json()["created"] is False and marker_judge.count() == calls
    body["groups"] = body["groups"][:1]
    conflict = client.post("/v1/batches", json=body)
    assert conflict.status_code == 409 and conflict.json()["detail"][0]["field"] == "batch_id"
    bad = client.post("/v1/batches", json={"groups": [small_group("q3"), small_group("q3")]})
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "groups[1].group_id"
    nested = small_group("q4")
    nested["rollouts"][0]["turns"][0]["results"][1]["id"] = "S1"
    bad = client.post("/v1/batches", json={"groups": [small_group("q5"), nested]})
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "groups[1].rollouts[0].turns[0].results[1].id"
    assert client.get("/v1/groups/q5").status_code == 404  # nothing of a rejected batch is stored


def test_streaming_rollouts(client: TestClient, marker_judge: JudgeServer) -> None:
    doc = small_group(expected_rollouts=3)
    first, second = doc["rollouts"]
    doc["rollouts"] = [first]
    assert client.post("/v1/groups", json=doc).status_code == 202
    r = client.post("/v1/groups/g1/rollouts", json=second)
    assert r.status_code == 202 and r.json()["rollouts_received"] == 2 and r.json()["created"] is True
    # Judging starts on arrival; normalization waits for the third rollout.
    deadline_ok = client.get("/v1/groups/g1/advantages", params={"wait": 1.0})
    assert deadline_ok.status_code == 409
    # Both rollouts get judged in full while the group still waits for its third (read
    # until they are: on a loaded machine the judging may outlast the 1 s wait).
    deadline = time.monotonic() + 30
    while (progress := client.get("/v1/groups/g1").json()["progress"])["judgments_done"] < 8:
        assert time.monotonic() < deadline, progress
        time.sleep(0.05)
    assert progress["judgments_done"] == progress["judgments_total"] == 8
    assert client.get("/v1/groups/g1").json()["status"] in ("queued", "running")
    assert client.post("/v1/groups/g1/rollouts", json=second).json()["created"] is False
    changed = {**second, "outcome_reward": 0.9}
    conflict = client.post("/v1/groups/g1/rollouts", json=changed)
    assert conflict.status_code == 409 and conflict.json()["detail"][0]["field"] == "id"
    # a GET where only POST is routed says which method to use
    wrong = client.get("/v1/groups/g1/rollouts")
    assert wrong.status_code == 405
    assert wrong.json()["message"] == "GET is not allowed on /v1/groups/g1/rollouts; use POST"
    missing = {"id": "c", "turns": [answer()]}
    r = client.post("/v1/groups/g1/rollouts", json=missing)
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "outcome_reward"
    third = rollout("c", visit(page("W1", "https://z.org", "[R1:1:h]")), answer(), reward=0.5)
    assert client.post("/v1/groups/g1/rollouts", json=third).status_code == 202
    fourth = rollout("d", visit(page("W1", "https://z.org", "[R1:1:h]")), answer(), reward=0.5)
    full = client.post("/v1/groups/g1/rollouts", json=fourth)
    assert full.status_code == 409 and full.json()["detail"] == [
        {"field": "group_id", "message": "group 'g1' already has all 3 rollouts (its expected_rollouts)"}
    ]
    done = client.get("/v1/groups/g1/advantages", params={"wait": 30})
    assert done.status_code == 200 and [r["id"] for r in done.json()["rollouts"]] == ["a", "b", "c"]
    extra = rollout("d", answer(), reward=0.1)
    assert client.post("/v1/groups/g1/rollouts", json=extra).status_code == 409


@pytest.mark.parametrize("policy", ["zero", "fail"])
def test_judge_failure_policies(database_url: str, policy: str) -> None:
    with running_judge(lambda call: Reply(content="no idea")) as broken, api_client(database_url, broken.url) as c:
        c.post("/v1/groups", json=small_group(params={"on_judge_failure": policy}))
        r = c.get("/v1/groups/g1/advantages", params={"wait": 30})
        status = c.get("/v1/groups/g1").json()
        if policy == "zero":
            assert r.status_code == 200
            assert all(t["credit"] in (0.0, None) for ro in r.json()["rollouts"] for t in ro["turns"])
            assert status["progress"]["judgments_failed"] == 8
            credits = c.get("/v1/groups/g1/credits").json()
            judgment = credits["rollouts"][0]["turns"][1]["judgments"][0]
            assert judgment["status"] == "failed" and judgment["failure_reason"].startswith("invalid after 2 attempts")
        else:
            assert r.status_code == 409 and r.json()["status"] == "failed"
            assert status["status"] == "failed" and "judgment failed" in status["error"]


def test_operations_endpoints(client: TestClient) -> None:
    post_and_wait(client, small_group())
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["database"] == "ok"
    text = client.get("/metrics").text
    assert 'drcredit_judge_calls_total{backend="openai",kind="visit",outcome="ok"}' in text
    assert 'drcredit_groups{status="done"}' in text


def test_health_checks_and_pages_answer_head(client: TestClient) -> None:
    """Uptime monitors and link checkers ask with HEAD: the answer is GET's status and
    headers, without a body (it was 405)."""
    pages = ("/ui", "/ui/", "/ui/groups/g1", "/ui/runs/r1", "/ui/usage", "/favicon.ico", "/docs", "/redoc")
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", *pages):
        got = client.get(path)
        head = client.head(path)
        assert (head.status_code, head.content) == (got.status_code, b""), path
        assert head.headers["content-type"] == got.headers["content-type"], path
    assert client.head("/v1/nothing-here").status_code == 404


def test_openapi_describes_every_endpoint(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    for path, method in [
        ("/v1/groups", "post"),
        ("/v1/groups/{group_id}", "get"),
        ("/v1/groups/{group_id}/rollouts", "post"),
        ("/v1/groups/{group_id}/advantages", "get"),
        ("/v1/groups/{group_id}/credits", "get"),
        ("/v1/groups/{group_id}/replay", "post"),
        ("/v1/batches", "post"),
        ("/v1/batches/{batch_id}/advantages", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
    ]:
        assert method in paths[path], path
    schemas = spec["components"]["schemas"]
    assert {"GroupIn", "Rollout", "ScoringParams", "AdvantagesDocument", "ReplayDocument"} <= set(schemas)
    assert "422" in paths["/v1/groups"]["post"]["responses"]


def test_a_batch_with_a_conflicting_group_stores_none_of_its_groups(
    client: TestClient, marker_judge: JudgeServer
) -> None:
    """Every check runs before the first group of a batch is stored."""
    assert client.post("/v1/groups", json=small_group("taken")).status_code == 202
    changed = small_group("taken", params={"cap": 0.5})
    r = client.post("/v1/batches", json={"batch_id": "late-conflict", "groups": [small_group("fresh"), changed]})
    assert r.status_code == 409 and "taken" in r.json()["message"]
    assert r.json()["detail"] == [{"field": "groups[1].params", "message": "differ in cap"}]
    assert client.get("/v1/groups/fresh").status_code == 404
    assert client.get("/v1/batches/late-conflict").status_code == 404
