"""Judge audits through the API (embedded mode, SQLite and Postgres), against judge
servers started here: the same script as the original judge, one that shifts levels in a
known way, one that cannot be reached; tenants kept apart.

The shifted judge answers as the marker judge does but says level 1 where the marker says
2, with the same support points: its histories are the original's, so every one of its
answers is known in advance and the report's figures are worked out by hand below.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.api import api_client
from tests.support.builders import answer, group_doc, page, rollout, rubric, visit
from tests.support.judge_server import Call, JudgeServer, Reply, marker_answer, running_judge
from tests.support.live import free_port


def shifted(call: Call) -> Reply:
    answer_ = marker_answer(call)
    if call.kind == "visit" and answer_["level"] == 2:
        answer_ = {**answer_, "level": 1}
    return Reply.json(answer_)


@pytest.fixture
def judges(marker_judge: JudgeServer) -> Iterator[dict[str, Any]]:
    with running_judge(marker_answer_reply) as same, running_judge(shifted) as shift:
        yield {
            "same": {"base_url": same.url, "model": "judge-test"},
            "shifted": {"base_url": shift.url, "model": "judge-b"},
            "down": {
                "base_url": f"http://127.0.0.1:{free_port()}/v1",
                "model": "judge-c",
                "max_attempts": 1,
                "outage_deadline_s": 1.0,
            },
            "_servers": {"same": same, "shifted": shift},
        }


def marker_answer_reply(call: Call) -> Reply:
    return Reply.json(marker_answer(call))


@pytest.fixture
def client(database_url: str, marker_judge: JudgeServer, judges: dict[str, Any]) -> Iterator[TestClient]:
    configured = {k: v for k, v in judges.items() if not k.startswith("_")}
    with api_client(database_url, marker_judge.url, audit_judges=configured, api_keys="alice:ka,bob:kb") as c:
        c.headers["Authorization"] = "Bearer ka"
        yield c


def three_rollouts(group_id: str, step: int) -> dict[str, Any]:
    """a: a visit with R1 2 and R2 1 (credit 0.7); b: R1 1 (0.2); c: R1 2 (0.5); each then answers."""
    return group_doc(
        rollout("a", visit(page("W1", "https://x.org/1", "[R1:2:f1] [R2:1:f2]")), answer(), reward=0.9),
        rollout("b", visit(page("W1", "https://x.org/2", "[R1:1:f3]")), answer(), reward=0.1),
        rollout("c", visit(page("W1", "https://x.org/3", "[R1:2:f4]")), answer(), reward=0.5),
        rubrics=[rubric("R1"), rubric("R2")],
        group_id=group_id,
        metadata={"run": "exp", "step": step},
    )


def scored(client: TestClient, doc: dict[str, Any]) -> dict[str, Any]:
    assert client.post("/v1/groups", json=doc).status_code == 202
    r = client.get(f"/v1/groups/{doc['group_id']}/advantages", params={"wait": 30})
    assert r.status_code == 200, r.text
    return r.json()


def audited(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/audits", json=body)
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "queued"
    done = client.get(f"/v1/audits/{r.json()['audit_id']}", params={"wait": 60})
    assert done.status_code == 200, done.text
    return done.json()


def test_an_audit_with_the_same_judge_agrees_fully(client: TestClient) -> None:
    for step in range(3):
        scored(client, three_rollouts(f"g{step}", step))
    report = audited(client, {"judge": "same", "scope": {"run": "exp"}, "sample_groups": 2, "seed": 7})
    assert report["status"] == "done" and len(report["group_ids"]) == 2
    visit = report["agreement"]["visit"]
    assert visit["pairs"] == 12 and visit["left_out"] == 0 and visit["exact"] == 1.0 and visit["kappa"] == 1.0
    assert visit["first_visit"]["pairs"] == 12
    for kind in ("snippet", "report_rubric", "citation"):  # no search, outcome given
        assert report["agreement"][kind]["pairs"] == 0 and report["agreement"][kind]["kappa"] is None
    effect = report["effect"]
    assert (effect["w1"], effect["rmse"], effect["fused_w1"]) == (0.0, 0.0, 0.0)
    assert effect["process_sign_agreement"] == 1.0 and effect["fused_sign_agreement"] == 1.0
    assert effect["outcome_rmse"] is None and len(effect["groups"]) == 2
    assert report["usage"]["calls"] == 12 and report["usage"]["prompt_tokens"] > 0
    # The same seed samples the same groups.
    again = audited(client, {"judge": "same", "scope": {"run": "exp"}, "sample_groups": 2, "seed": 7})
    assert again["group_ids"] == report["group_ids"]


def test_an_audit_with_a_judge_that_shifts_levels_gives_the_numbers_worked_by_hand(client: TestClient) -> None:
    original = scored(client, three_rollouts("g0", 0))
    report = audited(client, {"judge": "shifted", "scope": {"group_ids": ["g0"]}})
    # Visit pairs (original, audit): a-R1 (2, 1), a-R2 (1, 1), b-R1 (1, 1), b-R2 (0, 0),
    # c-R1 (2, 1), c-R2 (0, 0): 4 of 6 equal. Rows (0: 2, 1: 2, 2: 2), columns
    # (0: 2, 1: 4, 2: 0); w = (i - j)^2 / 4. sum(w O) = 1/4 * 2/6 = 1/12;
    # sum(w E) = 1/4 (1/3 * 2/3) + 1/4 (1/3 * 1/3) + 1 (1/3 * 1/3) + 1/4 (1/3 * 2/3) = 1/4.
    visit = report["agreement"]["visit"]
    assert visit["pairs"] == 6 and visit["exact"] == pytest.approx(4 / 6)
    assert visit["confusion"] == [[2, 0, 0], [0, 2, 0], [0, 2, 0]]
    assert visit["kappa"] == pytest.approx(1 - (1 / 12) / (1 / 4))
    assert visit["first_visit"]["pairs"] == 6
    # Bias: audit - original over the pairs: -1 (a-R1), -1 (c-R1), 0 elsewhere.
    assert visit["bias"] == pytest.approx(-2 / 6)
    assert visit["marginals"] == {
        "original": pytest.approx([2 / 6, 2 / 6, 2 / 6]),
        "audit": pytest.approx([2 / 6, 4 / 6, 0]),
    }
    assert report["agreement"]["snippet"]["bias"] is None and report["agreement"]["snippet"]["marginals"] is None
    # Credits: original (0.7, 0.2, 0.5), audit (0.2 + 0.2, 0.2, 0.2). A_rg = (c - mean) / std (ddof 0).
    orig = standardized([0.7, 0.2, 0.5])
    audit = standardized([0.4, 0.2, 0.2])
    assert [r["turns"][0]["process_advantage"] for r in original["rollouts"]] == pytest.approx(orig)
    w1 = sum(abs(x - y) for x, y in zip(sorted(orig), sorted(audit), strict=True)) / 3
    rmse = math.sqrt(sum((x - y) ** 2 for x, y in zip(orig, audit, strict=True)) / 3)
    effect = report["effect"]
    assert effect["turns"] == 3
    assert effect["w1"] == pytest.approx(w1) and effect["rmse"] == pytest.approx(rmse)
    # Signs: a (+, +), b (-, -), c (+, -).
    assert effect["process_sign_agreement"] == pytest.approx(2 / 3)
    # Fused = A_o + A_rg, A_o the rewards (0.9, 0.1, 0.5) standardized with ddof 1: the same on both sides.
    outcome = standardized([0.9, 0.1, 0.5], ddof=1)
    fused_orig = [o + p for o, p in zip(outcome, orig, strict=True)]
    fused_audit = [o + p for o, p in zip(outcome, audit, strict=True)]
    signs = [(x > 0) == (y > 0) for x, y in zip(fused_orig, fused_audit, strict=True)]
    assert effect["fused_sign_agreement"] == pytest.approx(sum(signs) / 3)
    assert effect["fused_rmse"] == pytest.approx(rmse)  # the same A_o on both sides
    assert effect["groups"][0]["group_id"] == "g0" and effect["groups"][0]["w1"] == pytest.approx(w1)


def standardized(values: list[float], ddof: int = 0) -> list[float]:
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - ddof))
    return [(v - mean) / std for v in values]


def test_an_unreachable_audit_judge_fails_the_audit_not_a_training_group(client: TestClient) -> None:
    scored(client, three_rollouts("g0", 0))
    before_doc = client.get("/v1/groups/g0/advantages").json()
    before_credits = client.get("/v1/groups/g0/credits").json()
    r = client.post("/v1/audits", json={"judge": "down", "scope": {"run": "exp"}})
    audit_id = r.json()["audit_id"]
    failed = client.get(f"/v1/audits/{audit_id}", params={"wait": 60})
    assert failed.status_code == 409, failed.text
    message = failed.json()["message"]
    assert f"audit '{audit_id}' is failed" in message and "unreachable" in message and "outage deadline" in message
    listed = client.get("/v1/audits").json()["audits"][0]
    assert listed["status"] == "failed" and "unreachable" in listed["error"]
    assert client.get("/v1/groups/g0").json()["status"] == "done"
    assert client.get("/v1/groups/g0/advantages").json() == before_doc
    assert client.get("/v1/groups/g0/credits").json() == before_credits


def test_a_tenant_cannot_see_or_start_another_tenants_audits(client: TestClient) -> None:
    scored(client, three_rollouts("g0", 0))
    report = audited(client, {"judge": "same", "scope": {"group_ids": ["g0"]}})
    bob = {"Authorization": "Bearer kb"}
    assert client.get(f"/v1/audits/{report['audit_id']}", headers=bob).status_code == 404
    assert client.get("/v1/audits", headers=bob).json() == {"audits": []}
    r = client.post("/v1/audits", json={"judge": "same", "scope": {"group_ids": ["g0"]}}, headers=bob)
    assert r.status_code == 422 and r.json()["detail"] == [{"field": "scope.group_ids[0]", "message": "no group 'g0'"}]
    r = client.post("/v1/audits", json={"judge": "same", "scope": {"run": "exp"}}, headers=bob)
    assert r.status_code == 404


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        (
            {"judge": "gpt-9", "scope": {"run": "exp"}},
            "judge",
            "no audit judge named 'gpt-9' (known: down, same, shifted)",
        ),
        ({"judge": "same", "scope": {}}, "scope", "give exactly one of run, batch_id, group_ids (got none)"),
        ({"judge": "same", "scope": {"run": "exp", "batch_id": "b"}}, "scope", "give exactly one"),
        ({"judge": "same", "scope": {"run": "exp"}, "sample_groups": 0}, "sample_groups", "greater than or equal to 1"),
        ({"judge": "same", "scope": {"run": "exp"}, "base_url": "http://evil/v1"}, "base_url", "unknown field"),
    ],
)
def test_bad_audit_requests_name_the_field(client: TestClient, body: dict[str, Any], field: str, message: str) -> None:
    scored(client, three_rollouts("g0", 0))
    r = client.post("/v1/audits", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert detail["field"] == field and message in detail["message"], detail


def test_what_is_not_found_is_named(client: TestClient) -> None:
    """A 404 names the field that was looked up, as every other 404 does."""
    scored(client, three_rollouts("g0", 0))
    for body, field, message in (
        ({"judge": "same", "scope": {"run": "nope"}}, "scope.run", "run 'nope' not found"),
        ({"judge": "same", "scope": {"batch_id": "nope"}}, "scope.batch_id", "batch 'nope' not found"),
    ):
        r = client.post("/v1/audits", json=body)
        assert r.status_code == 404 and r.json() == {
            "message": message,
            "detail": [{"field": field, "message": message}],
        }
    r = client.get("/v1/audits/aud-nope")
    assert r.status_code == 404
    assert r.json()["detail"] == [{"field": "audit_id", "message": "audit 'aud-nope' not found"}]


def test_a_scope_without_a_done_group_is_refused(client: TestClient) -> None:
    doc = three_rollouts("open", 0) | {"expected_rollouts": 5}
    assert client.post("/v1/groups", json=doc).status_code == 202
    r = client.post("/v1/audits", json={"judge": "same", "scope": {"group_ids": ["open"]}})
    assert r.status_code == 422 and r.json()["detail"][0] == {
        "field": "scope",
        "message": "no group in this scope is done yet",
    }


def test_the_audit_judges_come_from_the_operator_only(database_url: str, marker_judge: JudgeServer) -> None:
    bad = {"x": {"base_url": marker_judge.url, "wieght": 1}}
    with (
        pytest.raises(ValueError, match=r"DRCREDIT_AUDIT_JUDGES\.x\.wieght: unknown field"),
        api_client(database_url, marker_judge.url, audit_judges=bad),
    ):
        pass


def test_every_kind_is_compared_on_a_group_whose_outcome_the_service_judges(database_url: str) -> None:
    """The offline judge audited by itself on the judged example (searches, visits,
    rubrics, citations): every kind has pairs, all of them equal; the outcome rewards agree."""
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[2] / "examples" / "group_judged.json").read_text())
    with api_client(database_url, None, audit_judges={"again": {"judge": "offline"}}) as client:
        scored(client, doc)
        report = audited(client, {"judge": "again", "scope": {"group_ids": [doc["group_id"]]}})
    for kind in ("visit", "snippet", "report_rubric", "citation"):
        agreement = report["agreement"][kind]
        assert agreement["pairs"] > 0 and agreement["exact"] == 1.0, (kind, agreement)
        assert agreement["kappa"] in (1.0, None)
    assert report["effect"]["outcome_rmse"] == 0.0 and report["effect"]["w1"] == 0.0
    assert report["usage"]["calls"] > 0


def test_a_nul_in_an_audits_run_or_batch_is_refused_naming_the_field(client: TestClient) -> None:
    for scope in ({"run": "a\x00b"}, {"batch_id": "\x00"}):
        r = client.post("/v1/audits", json={"judge": "same", "scope": scope})
        assert r.status_code == 422, r.text
        assert [d["field"] for d in r.json()["detail"]] == [f"scope.{next(iter(scope))}"]
    r = client.get("/v1/audits", params={"run": "a\x00b"})
    assert r.status_code == 422 and [d["field"] for d in r.json()["detail"]] == ["query.run"], r.text
