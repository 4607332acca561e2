"""The outcome reward computed by the service (docs/method.md, "Outcome reward"), end to end over the API.

The scripted judge answers from markers: ``[R1=3]`` in a report scores rubric R1 at 3,
``[support=2]`` in a page's evidence gives claims citing it 2 (the joint call takes the
best page). The expected rewards are worked out by hand in ``expected_rewards``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.api import api_client
from tests.support.builders import group_doc, page, rollout, rubric, search, visit
from tests.support.judge_server import Call, JudgeServer, Reply, marker_answer, running_judge

RUBRICS = [rubric("R1", 2.0), rubric("R2", 1.0, kind="logical"), rubric("P", -1.0)]
REPORT_A = (
    '# Report\n## Detail\nClaim one <cite id="W1">opened in 2019</cite>. '
    'Both <cite id="W1, W2">two pages</cite>. [R1=4] [R2=2] [P=0]'
)


def answer(text: str) -> dict[str, Any]:
    return {"type": "answer", "reasoning": "write", "answer": text}


def judged_group(group_id: str = "o1", **params: Any) -> dict[str, Any]:
    a = rollout(
        "a",
        search(("S1", "https://u1.org/p")),
        visit(page("W1", "https://u1.org/p", "[R1:2:f1] text [support=2]")),
        visit(page("W2", "https://u2.org/p", "other text [support=0]")),
        answer(REPORT_A),
        reward=None,
    )
    b = rollout(
        "b", visit(page("W1", "https://u3.org/p", "[R2:1:g1] more")), answer("plain report [R1=1]"), reward=None
    )
    c = rollout("c", visit(page("W1", "https://u4.org/p", "nothing")), reward=None)
    return group_doc(a, b, c, rubrics=RUBRICS, params={"outcome_source": "judge", **params}, group_id=group_id)


def expected_rewards() -> dict[str, float]:
    """a: r_rubric (2 x 4/4 + 1 x 2/4 - 1 x 0) / 3 = 5/6; claims: W1 alone j 2 -> 1,
    W1+W2 j 2, pages (2, 0) -> 2 x 1 x 0.5 / 1.5 = 2/3; r_semantic 5/6, r_id 3/3 -> r_cite
    0.4 + 0.6 x 5/6 = 0.9; format 4/4; search 1/5; 15 words -> 15/2000.
    b: r_rubric 2 x 1/4 / 3 = 1/6; no citation; format (tools, reasoning) 2/4; no search;
    3 words -> 3/2000. c: no report -> 0."""
    a = 0.7 * 5 / 6 + 0.05 * 1 + 0.05 * 0.2 + 0.15 * 0.9 + 0.05 * 15 / 2000
    b = 0.7 * 1 / 6 + 0.05 * 0.5 + 0.05 * 3 / 2000
    return {"a": a, "b": b, "c": 0.0}


def standardized(rewards: dict[str, float | None]) -> dict[str, float]:
    present = [r for r in rewards.values() if r is not None]
    mu = sum(present) / len(present)
    sd = math.sqrt(sum((r - mu) ** 2 for r in present) / (len(present) - 1))
    return {k: 0.0 if r is None else (r - mu) / sd for k, r in rewards.items()}


@pytest.fixture
def client(database_url: str, marker_judge: JudgeServer) -> Iterator[TestClient]:
    with api_client(database_url, marker_judge.url) as c:
        yield c


def scored(client: TestClient, doc: dict[str, Any]) -> dict[str, Any]:
    assert client.post("/v1/groups", json=doc).status_code == 202
    r = client.get(f"/v1/groups/{doc['group_id']}/advantages", params={"wait": 60})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_the_service_computes_the_outcome_reward_and_its_advantage(
    client: TestClient, marker_judge: JudgeServer
) -> None:
    doc = scored(client, judged_group())
    want = expected_rewards()
    got = {r["id"]: r["outcome_reward"] for r in doc["rollouts"]}
    assert got == {k: pytest.approx(v) for k, v in want.items()}
    a_o = standardized(dict(want))
    for r in doc["rollouts"]:
        assert r["outcome_advantage"] == pytest.approx(a_o[r["id"]])
        final = r["turns"][-1]
        if final["type"] == "answer":
            assert final["advantage"] == pytest.approx(a_o[r["id"]])
    assert doc["stats"]["mu_o"] == pytest.approx(sum(want.values()) / 3)
    # 3 rubric calls per report (the penalty is judged too) and 1 + 3 citation calls for a.
    assert marker_judge.count("rubric") == 6 and marker_judge.count("citation") == 4
    assert doc["progress"]["judgments_total"] == doc["progress"]["judgments_done"]


def test_the_credits_breakdown_explains_each_reward(client: TestClient) -> None:
    scored(client, judged_group())
    credits = client.get("/v1/groups/o1/credits").json()
    outcome = {r["id"]: r.get("outcome") for r in credits["rollouts"]}
    a = outcome["a"]
    assert a["rubric_scores"] == {"R1": 4, "R2": 2, "P": 0}
    assert a["components"] == {
        "rubric": pytest.approx(5 / 6),
        "format": 1.0,
        "search": pytest.approx(0.2),
        "cite": pytest.approx(0.9),
        "length": pytest.approx(15 / 2000),
    }
    claims = a["claims"]
    assert [c["claim"] for c in claims] == ["opened in 2019", "two pages"]
    assert claims[1]["resolving"] == ["W1", "W2"] and claims[1]["joint"] == 2
    assert claims[1]["individual"] == {"W1": 2, "W2": 0} and claims[1]["score"] == pytest.approx(2 / 3)
    assert outcome["c"]["reward"] == 0.0 and outcome["c"]["rubric_scores"] == {}
    answer_turn = credits["rollouts"][0]["turns"][-1]
    kinds = sorted(j["kind"] for j in answer_turn["judgments"])
    assert kinds == ["citation"] * 4 + ["rubric"] * 3


def test_replay_recomputes_the_reward_under_other_weights_and_caps(
    client: TestClient, marker_judge: JudgeServer
) -> None:
    scored(client, judged_group())
    calls = marker_judge.count()
    weights = {"rubric": 1, "format": 0, "search": 0, "cite": 0, "length": 0}
    r = client.post("/v1/groups/o1/replay", json={"params": {"outcome_weights": weights}})
    assert r.status_code == 200, r.text
    got = {ro["id"]: ro["outcome_reward"] for ro in r.json()["rollouts"]}
    assert got == {"a": pytest.approx(5 / 6), "b": pytest.approx(1 / 6), "c": 0.0}
    r = client.post("/v1/groups/o1/replay", json={"params": {"search_cap": 1, "length_cap": 15}})
    a = next(ro for ro in r.json()["rollouts"] if ro["id"] == "a")
    assert a["outcome_reward"] == pytest.approx(expected_rewards()["a"] + 0.05 * 0.8 + 0.05 * (1 - 15 / 2000))
    assert marker_judge.count() == calls
    bad = client.post("/v1/groups/o1/replay", json={"params": {"outcome_source": "given"}})
    assert bad.status_code == 422


def failing_r2_on_b(call: Call) -> Reply:
    if call.kind == "rubric" and call.document["rubric_item"]["id"] == "R2" and "plain" in call.document["report"]:
        return Reply(content='{"score": 7}')  # out of range: invalid after every retry
    return Reply.json(marker_answer(call))


@pytest.mark.parametrize("policy", ["zero", "exclude", "fail"])
def test_a_failed_rubric_judgment_under_each_policy(database_url: str, policy: str) -> None:
    with running_judge(failing_r2_on_b) as judge, api_client(database_url, judge.url) as c:
        assert c.post("/v1/groups", json=judged_group(on_judge_failure=policy)).status_code == 202
        r = c.get("/v1/groups/o1/advantages", params={"wait": 60})
        status = c.get("/v1/groups/o1").json()
    if policy == "fail":
        assert r.status_code == 409 and status["status"] == "failed" and "rubric judgment failed" in status["error"]
        return
    doc = r.json()
    want = expected_rewards()
    assert doc["progress"]["judgments_failed"] == 1
    rewards = {ro["id"]: ro["outcome_reward"] for ro in doc["rollouts"]}
    flags = {ro["id"]: ro["outcome_unscorable"] for ro in doc["rollouts"]}
    assert flags == {"a": False, "b": True, "c": False}
    if policy == "zero":
        assert rewards == {k: pytest.approx(v) for k, v in want.items()}  # R2 scored 0 on b, as its marker says
    else:
        assert rewards["b"] is None and rewards["a"] == pytest.approx(want["a"])
        # b is left out of mu_o and sigma_o: A_o over a and c only.
        a_o = standardized({"a": want["a"], "b": None, "c": 0.0})
        assert {ro["id"]: ro["outcome_advantage"] for ro in doc["rollouts"]} == {
            k: pytest.approx(v) for k, v in a_o.items()
        }


def test_a_failed_citation_call_leaves_its_claim_out(database_url: str) -> None:
    def script(call: Call) -> Reply:
        if call.kind == "citation" and call.document["claim"] == "two pages" and len(call.document["cited_pages"]) == 1:
            return Reply(content="not json")
        return Reply.json(marker_answer(call))

    with running_judge(script) as judge, api_client(database_url, judge.url) as c:
        doc = scored(c, judged_group(on_judge_failure="exclude"))
        credits = c.get("/v1/groups/o1/credits").json()
    a = next(r for r in doc["rollouts"] if r["id"] == "a")
    # r_semantic = 1 (the first claim alone), r_cite = 0.4 + 0.6 = 1.0 instead of 0.9.
    assert a["outcome_reward"] == pytest.approx(expected_rewards()["a"] + 0.15 * 0.1)
    claims = credits["rollouts"][0]["outcome"]["claims"]
    assert claims[1]["left_out"] is True and claims[1]["score"] is None
    assert doc["progress"]["judgments_failed"] >= 1


def test_a_given_reward_is_refused_with_judge_source(client: TestClient) -> None:
    doc = judged_group()
    doc["rollouts"][0]["outcome_reward"] = 0.5
    r = client.post("/v1/groups", json=doc)
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "rollouts[0].outcome_reward"


def test_streamed_rollouts_are_outcome_judged_on_arrival(client: TestClient, marker_judge: JudgeServer) -> None:
    doc = judged_group("s1")
    rollouts = doc["rollouts"]
    opening = {**doc, "rollouts": rollouts[:1], "expected_rollouts": 3}
    assert client.post("/v1/groups", json=opening).status_code == 202
    deadline = 0
    while marker_judge.count("rubric") < 3 and deadline < 300:
        client.get("/v1/groups/s1")
        deadline += 1
    assert marker_judge.count("rubric") == 3  # a's report judged before b and c arrive
    given = {**rollouts[1], "outcome_reward": 0.3}
    assert client.post("/v1/groups/s1/rollouts", json=given).status_code == 422
    for r in rollouts[1:]:
        assert client.post("/v1/groups/s1/rollouts", json=r).status_code == 202
    doc = client.get("/v1/groups/s1/advantages", params={"wait": 60}).json()
    assert {r["id"]: r["outcome_reward"] for r in doc["rollouts"]} == {
        k: pytest.approx(v) for k, v in expected_rewards().items()
    }


def test_identical_outcome_requests_in_a_group_are_made_once(client: TestClient, marker_judge: JudgeServer) -> None:
    """a2 repeats a's turns and report: its 3 rubric and 4 citation requests are a's."""
    doc = judged_group("twins")
    twin = {**doc["rollouts"][0], "id": "a2"}
    doc["rollouts"].append(twin)
    scored_doc = scored(client, doc)
    assert marker_judge.count("rubric") == 6 and marker_judge.count("citation") == 4
    rewards = {r["id"]: r["outcome_reward"] for r in scored_doc["rollouts"]}
    assert rewards["a2"] == pytest.approx(rewards["a"]) == pytest.approx(expected_rewards()["a"])
