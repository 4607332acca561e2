"""Judge usage and cost in the documents (docs/api.md, "Judge usage and cost"), summed by
hand over a judge whose every answer reports fixed usage.

The hand-worked group (tests/support/scenarios.py) under :func:`usage_script`: a visit
call reports 1,000 prompt tokens (600 cached) and 40 completion tokens, a snippet call
300 and 20 (none cached), an unusable answer ("no idea") 1,000 and 2. Rollout b's visit
never gets a usable R2 answer (failed after its 2 attempts); rollout a's second visit
gets one for R2 only on its retry.

- a: snippet 300/20/0; t1 R1, t1 R2, t2 R1 1000/40/600 each; t2 R2 1000/2/0 then
  1000/40/600: 6 calls, 5 judgments, 5,300 prompt (2,400 cached), 182 completion.
  At 2 / 0.5 / 8 USD per million: (2,900 x 2 + 2,400 x 0.5 + 182 x 8) / 1e6 = 0.008456.
- b: t0 R1 1000/40/600; t0 R2 1000/2/0 twice; snippet 300/20/0: 4 calls, 3 judgments,
  3,300 prompt (600 cached), 64 completion: (2,700 x 2 + 300 + 512) / 1e6 = 0.006212.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.support.api import api_client
from tests.support.builders import answer, group_doc, page, rollout, rubric, tool, visit
from tests.support.judge_server import Call, Reply, marker_answer, running_judge
from tests.support.scenarios import hand_worked_group

VISIT = {"prompt_tokens": 1000, "completion_tokens": 40, "prompt_tokens_details": {"cached_tokens": 600}}
SNIPPET = {"prompt_tokens": 300, "completion_tokens": 20}
UNUSABLE = {"prompt_tokens": 1000, "completion_tokens": 2}
OUTCOME = {"prompt_tokens": 500, "completion_tokens": 10}
PRICE = "2,0.5,8"

USAGE_A = {
    "calls": 6,
    "judgments": 5,
    "prompt_tokens": 5300,
    "completion_tokens": 182,
    "cached_prompt_tokens": 2400,
    "estimated_prompt_tokens": 0,
    "reused": 0,
    "cached_prompt_share": pytest.approx(2400 / 5300),
    "cost_usd": pytest.approx(0.008456),
}
USAGE_B = {
    "calls": 4,
    "judgments": 3,
    "prompt_tokens": 3300,
    "completion_tokens": 64,
    "cached_prompt_tokens": 600,
    "estimated_prompt_tokens": 0,
    "reused": 0,
    "cached_prompt_share": pytest.approx(600 / 3300),
    "cost_usd": pytest.approx(0.006212),
}
USAGE_GROUP = {
    "calls": 10,
    "judgments": 8,
    "prompt_tokens": 8600,
    "completion_tokens": 246,
    "cached_prompt_tokens": 3000,
    "estimated_prompt_tokens": 0,
    "reused": 0,
    "cached_prompt_share": pytest.approx(3000 / 8600),
    "cost_usd": pytest.approx(0.014668),
}


def usage_script(call: Call) -> Reply:
    if call.kind == "snippet":
        return Reply.json(marker_answer(call), usage=SNIPPET)
    if call.kind in ("rubric", "citation"):
        return Reply.json(marker_answer(call), usage=OUTCOME)
    urls = [p["url"] for p in call.document["visit"]["pages"]]
    rubric_id = call.document["rubric_item"]["id"]
    first_try = not any(m["role"] == "assistant" for m in call.request["messages"])
    if rubric_id == "R2" and "https://www.u1.org/p/" in urls:
        # Slow as well: under on_judge_failure fail the group fails after every other call.
        return Reply(content="no idea", usage=UNUSABLE, delay=0.5)
    if rubric_id == "R2" and "https://u2.org/p" in urls and first_try:
        return Reply(content="no idea", usage=UNUSABLE)
    return Reply.json(marker_answer(call), usage=VISIT)


def scored(client: TestClient, doc: dict[str, Any]) -> dict[str, Any]:
    assert client.post("/v1/groups", json=doc).status_code == 202
    r = client.get(f"/v1/groups/{doc['group_id']}/advantages", params={"wait": 60})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def metric_sums(client: TestClient) -> dict[tuple[str, str], float]:
    """(metric, direction or "") -> the sum of its samples over the other labels."""
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name in ("drcredit_judge_tokens_total", "drcredit_judge_cost_usd_total"):
                key = (sample.name, sample.labels.get("direction", ""))
                out[key] = out.get(key, 0.0) + sample.value
    return out


def judgment(credits: dict[str, Any], rollout_id: str, turn: int, rubric_id: str) -> dict[str, Any]:
    r = next(r for r in credits["rollouts"] if r["id"] == rollout_id)
    found: dict[str, Any] = next(j for j in r["turns"][turn]["judgments"] if j.get("rubric_id") == rubric_id)
    return found


def test_usage_per_rollout_sums_to_the_group_and_is_priced(database_url: str) -> None:
    with running_judge(usage_script) as judge, api_client(database_url, judge.url, judge_price=PRICE) as c:
        before = metric_sums(c)
        adv = scored(c, hand_worked_group(group_id="g"))
        after = metric_sums(c)
        rollouts = {r["id"]: r["usage"] for r in adv["rollouts"]}
        assert rollouts == {"a": USAGE_A, "b": USAGE_B}
        assert adv["usage"] == USAGE_GROUP
        for key in ("calls", "judgments", "prompt_tokens", "completion_tokens", "cached_prompt_tokens"):
            assert adv["usage"][key] == sum(u[key] for u in rollouts.values())
        assert adv["progress"]["judge_calls"] == adv["usage"]["judgments"] and judge.count() == 10
        status = c.get("/v1/groups/g").json()
        assert status["usage"] == USAGE_GROUP

        credits = c.get("/v1/groups/g/credits").json()
        ok = judgment(credits, "a", 1, "R1")
        assert (ok["prompt_tokens"], ok["completion_tokens"], ok["cached_prompt_tokens"]) == (1000, 40, 600)
        assert (ok["endpoint"], ok["served_model"], ok["model"]) == (judge.url, "judge-test", "judge-test")
        assert [(a["prompt_tokens"], a["cached_tokens"], a["endpoint"]) for a in ok["attempts"]] == [
            (1000, 600, judge.url)
        ]
        # A failed judgment's attempts still count: 2 x (1,000 prompt, 2 completion).
        failed = judgment(credits, "b", 0, "R2")
        assert failed["status"] == "failed" and (failed["prompt_tokens"], failed["completion_tokens"]) == (2000, 4)
        assert [(a["outcome"], a["prompt_tokens"], a["completion_tokens"]) for a in failed["attempts"]] == [
            ("invalid", 1000, 2),
            ("invalid", 1000, 2),
        ]
        assert failed["endpoint"] == judge.url
        retried = judgment(credits, "a", 2, "R2")
        assert [a["outcome"] for a in retried["attempts"]] == ["invalid", "ok"] and retried["prompt_tokens"] == 2000

        # Prometheus: the cached part of the prompt tokens, and the cost at the price.
        delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
        assert delta[("drcredit_judge_tokens_total", "prompt")] == 8600
        assert delta[("drcredit_judge_tokens_total", "cached_prompt")] == 3000
        assert delta[("drcredit_judge_tokens_total", "completion")] == 246
        assert delta[("drcredit_judge_cost_usd_total", "")] == pytest.approx(0.014668)

    # The stored document is served as stored, its cost at the price it was finished
    # under; the status document is read live, at the price set now.
    with api_client(database_url, None, judge_price="4,1,16") as c:
        assert c.get("/v1/groups/g/advantages").json() == adv
        assert c.get("/v1/groups/g").json()["usage"]["cost_usd"] == pytest.approx(2 * 0.014668)
    with api_client(database_url, None) as c:
        assert c.get("/v1/groups/g/advantages").json()["usage"]["cost_usd"] == pytest.approx(0.014668)
        assert c.get("/v1/groups/g").json()["usage"] == {**USAGE_GROUP, "cost_usd": None}


def twins_group(group_id: str, rollouts: int, **extra: Any) -> dict[str, Any]:
    """``rollouts`` rollouts making the same visit first: one call per rubric, the others reuse it."""
    made = [
        rollout(f"r{k}", visit(page("W1", "https://c.org/p", "[R1:2:f1] [R2:1:g1]")), answer(), reward=k / rollouts)
        for k in range(rollouts)
    ]
    return group_doc(*made, rubrics=[rubric("R1"), rubric("R2")], group_id=group_id, **extra)


#: Two calls of 1,000 prompt (600 cached) and 40 completion tokens: (800 x 2 + 1,200 x 0.5 + 80 x 8) / 1e6.
TWO_VISIT_CALLS = {
    "calls": 2,
    "judgments": 2,
    "prompt_tokens": 2000,
    "completion_tokens": 80,
    "cached_prompt_tokens": 1200,
    "estimated_prompt_tokens": 0,
    "reused": 0,
    "cached_prompt_share": 0.6,  # 1,200 / 2,000
    "cost_usd": pytest.approx(0.00284),
}


def test_a_reused_answer_counts_no_call_and_no_token(database_url: str) -> None:
    # Reuse within groups only: the two groups make the same requests, and each must ask once.
    with (
        running_judge(usage_script) as judge,
        api_client(database_url, judge.url, judge_price=PRICE, judge_reuse="group") as c,
    ):
        body = {"batch_id": "b", "groups": [twins_group("twins", 3), twins_group("pair", 2)]}
        assert c.post("/v1/batches", json=body).status_code == 202
        batch = c.get("/v1/batches/b/advantages", params={"wait": 60}).json()
        adv, pair = batch["groups"]
        # One call per positive rubric and group; the other rollouts reuse both answers.
        assert judge.count() == 4 and (adv["progress"]["cache_hits"], pair["progress"]["cache_hits"]) == (4, 2)
        assert adv["usage"] == pair["usage"] == TWO_VISIT_CALLS
        # The batch's status sums its groups'.
        assert c.get("/v1/batches/b").json()["usage"] == {
            **{k: 2 * v for k, v in TWO_VISIT_CALLS.items() if k not in ("cost_usd", "cached_prompt_share")},
            "cached_prompt_share": 0.6,
            "cost_usd": pytest.approx(2 * 0.00284),
        }
        per_rollout = [r["usage"] for r in adv["rollouts"]]
        assert sum(u["calls"] for u in per_rollout) == 2 and sum(u["prompt_tokens"] for u in per_rollout) == 2000
        credits = c.get("/v1/groups/twins/credits").json()
        reused = [j for r in credits["rollouts"] for j in r["turns"][0]["judgments"] if j["cache_hit"]]
        assert len(reused) == 4
        for j in reused:
            assert (j["prompt_tokens"], j["completion_tokens"], j["cached_prompt_tokens"], j["attempts"]) == (
                0,
                0,
                0,
                [],
            )
            # Who gave the answer it reused.
            assert (j["endpoint"], j["served_model"]) == (judge.url, "judge-test")


def test_outcome_judgments_count_in_their_rollouts_usage(database_url: str) -> None:
    """outcome_source judge: a rubric call per (report, rubric) and a citation call per
    claim, 500 prompt and 10 completion tokens each, beside one visit call per rollout.

    a: visit + rubric R1 + the claim citing W1 (one page: its joint call) = 3 calls,
    2,000 prompt (600 cached), 60 completion; b: visit + rubric R1 = 2 calls, 1,500
    prompt (600 cached), 50 completion.
    """
    doc = group_doc(
        rollout(
            "a",
            visit(page("W1", "https://o.org/1", "[R1:2:f1] [support=2]")),
            answer('Report: <cite id="W1">the plant opened</cite>. [R1=4]'),
            reward=None,
        ),
        rollout("b", visit(page("W1", "https://o.org/2", "nothing here")), answer("plain [R1=1]"), reward=None),
        rubrics=[rubric("R1")],
        params={"outcome_source": "judge"},
        group_id="judged",
    )
    with running_judge(usage_script) as judge, api_client(database_url, judge.url) as c:
        adv = scored(c, doc)
        assert [judge.count(k) for k in ("visit", "rubric", "citation")] == [2, 2, 1]
    zero = {"estimated_prompt_tokens": 0, "reused": 0, "cost_usd": None}
    assert {r["id"]: r["usage"] for r in adv["rollouts"]} == {
        "a": {"calls": 3, "judgments": 3, "prompt_tokens": 2000, "completion_tokens": 60, "cached_prompt_tokens": 600}
        | zero
        | {"cached_prompt_share": 0.3},
        "b": {"calls": 2, "judgments": 2, "prompt_tokens": 1500, "completion_tokens": 50, "cached_prompt_tokens": 600}
        | zero
        | {"cached_prompt_share": 0.4},
    }
    assert (
        adv["usage"]
        == {
            "calls": 5,
            "judgments": 5,
            "prompt_tokens": 3500,
            "completion_tokens": 110,
            "cached_prompt_tokens": 1200,
            "cached_prompt_share": pytest.approx(1200 / 3500),
        }
        | zero
    )


def test_a_call_cut_off_by_its_timeout_counts_estimated_prompt_tokens(database_url: str) -> None:
    def script(call: Call) -> Reply:
        return Reply.json(marker_answer(call), usage=VISIT, delay=1.5 if call.number == 1 else 0.0)

    # One judge call in the group (b makes none): nothing is known of the endpoint's
    # tokenizer when the first attempt times out, so its estimate is the most tokens
    # plausible, at 2 characters a token.
    doc = group_doc(
        rollout("a", visit(page("W1", "https://t.org/p", "[R1:2:f1]")), answer(), reward=1.0),
        rollout("b", tool(), answer(), reward=0.0),
        rubrics=[rubric("R1")],
        group_id="slow",
    )
    with running_judge(script) as judge, api_client(database_url, judge.url, judge_timeout_s=0.5) as c:
        adv = scored(c, doc)
        chars = sum(len(m["content"]) for m in judge.calls[0].request["messages"])
        estimate = chars // 2 + 1
        assert adv["usage"] == {
            "calls": 2,
            "judgments": 1,
            "prompt_tokens": estimate + 1000,
            "completion_tokens": 40,
            "cached_prompt_tokens": 600,
            "estimated_prompt_tokens": estimate,
            "reused": 0,
            "cached_prompt_share": pytest.approx(600 / (estimate + 1000)),
            "cost_usd": None,
        }
        attempts = judgment(c.get("/v1/groups/slow/credits").json(), "a", 0, "R1")["attempts"]
        assert [(a["outcome"], a["prompt_tokens"], a["estimated"], a["endpoint"]) for a in attempts] == [
            ("timeout", estimate, True, judge.url),
            ("ok", 1000, False, judge.url),
        ]


def test_a_runs_steps_carry_usage_in_all_and_per_trajectory_and_the_run_its_workload_row(database_url: str) -> None:
    # Reuse within groups only: step 1 posts the same group twice, and each must ask the judge.
    with (
        running_judge(usage_script) as judge,
        api_client(database_url, judge.url, judge_price=PRICE, judge_reuse="group") as c,
    ):
        scored(c, hand_worked_group(group_id="s1", metadata={"run": "usage", "step": 1}))
        scored(c, twins_group("s2", 3, metadata={"run": "usage", "step": 2}))
        # A group of step 1 that fails (b's visit never gets a usable R2 answer, and
        # its answers come last): its calls count in the step's usage, but it scored
        # no trajectory.
        lost = hand_worked_group(group_id="s1-lost", metadata={"run": "usage", "step": 1})
        assert c.post("/v1/groups", json={**lost, "params": {"on_judge_failure": "fail"}}).status_code == 202
        assert c.get("/v1/groups/s1-lost/advantages", params={"wait": 60}).json()["status"] == "failed"
        assert c.get("/v1/groups/s1-lost").json()["usage"] == USAGE_GROUP
        run = c.get("/v1/runs/usage").json()
    one, two = run["steps"]
    assert one["usage"] == {
        **{k: 2 * v for k, v in USAGE_GROUP.items() if k not in ("cost_usd", "cached_prompt_share")},
        "cached_prompt_share": pytest.approx(6000 / 17200),
        "cost_usd": pytest.approx(2 * 0.014668),
    }
    # Per trajectory: the done group's usage over its 2 trajectories.
    assert one["trajectories"] == 2 and one["usage_per_trajectory"] == {
        "calls": 5.0,
        "judgments": 4.0,
        "prompt_tokens": 4300.0,
        "completion_tokens": 123.0,
        "cached_prompt_tokens": 1500.0,
        "estimated_prompt_tokens": 0.0,
        "reused": 0.0,
        "cached_prompt_share": pytest.approx(3000 / 8600),  # the sums' ratio
        "cost_usd": pytest.approx(0.007334),
    }
    assert one["judge_calls"]["process"] == 16 and one["judge_calls"]["process_per_trajectory"] == 4.0
    assert two["usage"] == TWO_VISIT_CALLS and two["trajectories"] == 3
    assert two["usage_per_trajectory"] == {
        "calls": pytest.approx(2 / 3),
        "judgments": pytest.approx(2 / 3),
        "prompt_tokens": pytest.approx(2000 / 3),
        "completion_tokens": pytest.approx(80 / 3),
        "cached_prompt_tokens": pytest.approx(400.0),
        "estimated_prompt_tokens": 0.0,
        "reused": 0.0,
        "cached_prompt_share": 0.6,
        "cost_usd": pytest.approx(0.00284 / 3),
    }
    # The workload row: each step's per-trajectory figure, averaged over the 2 steps.
    work = run["workload"]
    assert (work["steps"], work["trajectories"]) == (2, 5)
    assert work["process_judge_tasks_per_trajectory"] == pytest.approx((4 + 2 / 3) / 2)
    assert work["outcome_judge_tasks_per_trajectory"] == 0.0
    latency = [s["latency_per_trajectory_s"]["mean"] for s in (one, two)]
    assert work["scoring_latency_per_trajectory_s"] == pytest.approx(sum(latency) / 2)
    per = work["usage_per_trajectory"]
    assert per["calls"] == pytest.approx((5 + 2 / 3) / 2)
    assert per["prompt_tokens"] == pytest.approx((4300 + 2000 / 3) / 2)
    assert per["cost_usd"] == pytest.approx((0.007334 + 0.00284 / 3) / 2)
    assert (work["usage"]["calls"], work["usage"]["prompt_tokens"]) == (22, 2 * 8600 + 2000)
    assert work["usage"]["cost_usd"] == pytest.approx(2 * 0.014668 + 0.00284)
