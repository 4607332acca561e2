"""Budgets and usage per tenant over the real app (docs/api.md, "Tenants, shares and
budgets"), on SQLite and Postgres, against a judge whose every answer reports 100 prompt
and 10 completion tokens: a tenant's tokens are 110 per call the judge received for it.

- refuse: groups admitted before the budget was reached all finish; the next new work
  is a 429 naming the budget, what is used, its limit and its reset (the next UTC
  midnight), with Retry-After; a re-post of admitted work is answered as before.
- wait: a group past the budget is stored, shows ``waiting_for_budget``, gets no judge
  call until the window resets (a short test window), then starts within 5 s of it.
- usage: the key's tenant only; the operator's key reads every tenant's.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from drcredit.client._common import Waiter
from drcredit.client.errors import DrCreditTimeout
from tests.support.api import api_client
from tests.support.judge_server import Call, Reply, marker_answer, running_judge
from tests.support.scenarios import hand_worked_group

PER_CALL = {"prompt_tokens": 100, "completion_tokens": 10}
KEYS = "a:key-a,b:key-b,ops:key-ops,w:key-w"
A, B, OPS, W = ({"Authorization": f"Bearer key-{t}"} for t in ("a", "b", "ops", "w"))


def fixed_usage(call: Call) -> Reply:
    return Reply.json(marker_answer(call), usage=PER_CALL)


def tenant_metric(client: TestClient, name: str, tenant: str) -> float:
    """The sum of the metric's samples of ``tenant`` (over its other labels)."""
    return sum(
        float(sample.value)
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for sample in family.samples
        if sample.name == name and sample.labels.get("tenant") == tenant
    )


def done(client: TestClient, headers: dict[str, str], group_id: str, wait: float = 60) -> dict[str, Any]:
    r = client.get(f"/v1/groups/{group_id}/advantages", params={"wait": wait}, headers=headers)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_refuse_past_a_budget_after_admitted_work_finishes(database_url: str) -> None:
    tenants = '{"a": {"budget": {"tokens_per_day": 1}}, "ops": {"operator": true}}'
    with running_judge(fixed_usage) as judge, api_client(database_url, judge.url, api_keys=KEYS, tenants=tenants) as c:
        calls_before = tenant_metric(c, "drcredit_tenant_judge_calls_total", "a")
        tokens_before = tenant_metric(c, "drcredit_tenant_judge_tokens_total", "a")
        # Nothing used yet: the whole batch is admitted, and every group ends done even
        # though the first answers already pass the budget of one token.
        batch = {"batch_id": "s1", "groups": [hand_worked_group(group_id=f"g{i}") for i in range(3)]}
        assert c.post("/v1/batches", json=batch, headers=A).status_code == 202
        for i in range(3):
            assert done(c, A, f"g{i}")["status"] == "done"
        calls = judge.count()
        assert calls > 0

        r = c.post("/v1/groups", json=hand_worked_group(group_id="late"), headers=A)
        assert r.status_code == 429, r.text
        midnight = (datetime.now(UTC) + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
        assert r.json()["error"] == {
            "code": "budget_exhausted",
            "budget": "tokens_per_day",
            "limit": 1,
            "used": calls * 110,
            "resets_at": midnight.isoformat(),
        }
        retry = int(r.headers["retry-after"])
        assert abs(retry - math.ceil((midnight - datetime.now(UTC)).total_seconds())) <= 2
        assert (
            c.post("/v1/batches", json={"batch_id": "s2", "groups": [hand_worked_group()]}, headers=A).status_code
            == 429
        )
        assert c.get("/v1/groups/late", headers=A).status_code == 404  # nothing stored
        # Admitted work re-posted is answered as before; another tenant is not held back.
        assert c.post("/v1/batches", json=batch, headers=A).status_code == 202
        assert c.post("/v1/groups", json=hand_worked_group(group_id="b1"), headers=B).status_code == 202
        done(c, B, "b1")
        b_calls = judge.count() - calls
        assert b_calls > 0

        usage = c.get("/v1/usage", headers=A).json()
        assert usage["tenant"] == "a"
        assert usage["day"]["prompt_tokens"] == calls * 100 and usage["day"]["completion_tokens"] == calls * 10
        assert usage["month"]["calls"] == calls and usage["day"]["calls"] == calls
        assert usage["budgets"] == {
            "tokens_per_day": {
                "limit": 1,
                "used": calls * 110,
                "left": 0,
                "used_ratio": calls * 110,
                "resets_at": midnight.isoformat(),
            }
        }
        assert 0 < usage["share_last_minute"] < 1  # a and b were both served this minute
        assert c.get("/v1/usage", headers=B).json()["budgets"] == {}

        # Per-tenant metrics of the calls made in this process.
        assert tenant_metric(c, "drcredit_tenant_judge_calls_total", "a") - calls_before == calls
        # prompt + completion (+ cached prompt tokens: none reported)
        assert tenant_metric(c, "drcredit_tenant_judge_tokens_total", "a") - tokens_before == calls * 110

        # Another tenant's usage: the operator's key only.
        refused = c.get("/v1/usage", params={"tenant": "a"}, headers=B)
        assert refused.status_code == 403 and refused.json()["detail"][0]["field"] == "tenant"
        refused = c.get("/v1/usage/tenants", headers=B)
        assert refused.status_code == 403 and refused.json()["detail"][0]["field"] == "authorization"
        assert c.get("/v1/usage", headers=B).json()["operator"] is False
        assert c.get("/v1/usage", headers=OPS).json()["operator"] is True
        assert c.get("/v1/usage", params={"tenant": "a"}, headers=OPS).json()["day"]["calls"] == calls
        # A tenant no database can hold is refused, naming the field (Postgres refuses a NUL).
        for bad in ("a\x00b", "x" * 129):
            refused = c.get("/v1/usage", params={"tenant": bad}, headers=OPS)
            assert refused.status_code == 422, refused.text
            assert refused.json()["detail"][0]["field"] == "query.tenant", refused.json()
        listed = {t["tenant"]: t for t in c.get("/v1/usage/tenants", headers=OPS).json()["tenants"]}
        assert set(listed) == {"a", "b", "ops", "w"}
        assert listed["b"]["day"]["calls"] == b_calls and listed["ops"]["day"]["calls"] == 0


def test_wait_holds_new_groups_until_the_window_resets(database_url: str) -> None:
    tenants = '{"w": {"budget": {"tokens_per_day": 1}, "on_budget": "wait"}}'
    window = 8.0
    with (
        running_judge(fixed_usage) as judge,
        api_client(database_url, judge.url, api_keys=KEYS, tenants=tenants, budget_window_s=window) as c,
    ):
        held: dict[str, Any] | None = None
        for i in range(4):  # a window may reset between two posts: then that group runs
            posted = c.post("/v1/groups", json=hand_worked_group(group_id=f"w{i}"), headers=W)
            assert posted.status_code == 202
            status = c.get(f"/v1/groups/w{i}", headers=W).json()
            if status["status"] == "waiting_for_budget":
                assert posted.json()["status"] == "waiting_for_budget"  # the POST says so too
                again = c.post("/v1/groups", json=hand_worked_group(group_id=f"w{i}"), headers=W)
                assert again.json()["status"] == "waiting_for_budget" and again.json()["created"] is False
                held = status
                break
            done(c, W, f"w{i}")
        assert held is not None
        resets_at = datetime.fromisoformat(held["waiting_for_budget"]["resets_at"])
        assert held["waiting_for_budget"]["budget"] == "tokens_per_day"
        assert resets_at.timestamp() % window == 0 and resets_at > datetime.now(UTC)
        r = c.get(f"/v1/groups/{held['group_id']}/advantages", headers=W)
        assert r.status_code == 409 and r.json()["status"] == "waiting_for_budget"
        before = judge.count()
        time.sleep(max(0.0, (resets_at - datetime.now(UTC)).total_seconds() - 0.5))
        assert judge.count() == before  # nothing of it sent before the reset
        assert done(c, W, held["group_id"])["status"] == "done"
        started = datetime.fromisoformat(c.get(f"/v1/groups/{held['group_id']}", headers=W).json()["started_at"])
        started = started if started.tzinfo else started.replace(tzinfo=UTC)  # SQLite keeps no zone
        assert resets_at <= started <= resets_at + timedelta(seconds=5)


def test_the_sdk_wait_says_a_group_waits_for_its_budget() -> None:
    waiter = Waiter("group", "g", timeout=0.0, poll_wait=1.0, progress=False)
    waiter.saw_status(
        {
            "status": "waiting_for_budget",
            "progress": {"judgments_done": 0, "judgments_total": 4},
            "waiting_for_budget": {"budget": "usd_per_day", "resets_at": "2026-11-27T00:00:00+00:00"},
        }
    )
    try:
        waiter.check_deadline()
    except DrCreditTimeout as exc:
        assert "waiting_for_budget" in str(exc) and "usd_per_day" in str(exc)
        assert "2026-11-27T00:00:00+00:00" in str(exc)
    else:
        raise AssertionError("the deadline passed without a timeout")


def test_policies_for_tenants_without_keys_are_warned_of_at_start(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Without DRCREDIT_API_KEYS every request is tenant "public": policies naming other
    tenants would apply to nothing, and the API says so when it starts."""
    tenants = '{"trainer": {"weight": 3}, "public": {"weight": 1}}'
    with (
        caplog.at_level("WARNING", logger="drcredit.api"),
        running_judge(fixed_usage) as judge,
        api_client(database_url, judge.url, api_keys="", tenants=tenants) as c,
    ):
        assert c.get("/v1/usage").status_code == 200
    warned = [r.getMessage() for r in caplog.records if "DRCREDIT_TENANTS names" in r.getMessage()]
    assert warned == [
        "DRCREDIT_TENANTS names trainer, but without DRCREDIT_API_KEYS every request is tenant 'public':"
        " those policies apply to no group posted here"
    ]
