"""Judge audits under the tenants' budgets (docs/api.md, "Tenants, shares and budgets"),
over the real app on SQLite and Postgres. The scoring judge and the audit judge each
answer every call with 100 prompt and 10 completion tokens (110 a call).

Worked by hand: the group of ``three_rollouts`` (three rollouts, one visit each, two
positive rubrics, outcome rewards given) is scored with 6 visit calls: 600 prompt and 60
completion tokens, 660 in all. A judge audit of it re-scores the same 6 visits: another 6
calls and 660 tokens, so the tenant's day and month then read 12 calls and 1320 tokens.

- counted: the audit's usage (its report's) is added to the tenant's day and month once
  (as its calls come back: ``test_audit_spend``); a budget between the two (1000 tokens)
  admits the audit and refuses the next work. An audit that fails after its calls came
  back counts them too.
- refuse: past ``tokens_per_day`` a judge audit is a 429 naming the budget, what is
  used, its limit and its reset, with Retry-After; nothing is stored and the audit judge
  gets no call. An audit against people's labels calls no judge and is not refused.
- wait: the audit is stored held (``waiting_for_budget``) and gets no call before the
  short test window resets; then it runs to done without another request.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from drcredit.audit import service
from tests.api.test_audits import three_rollouts
from tests.api.test_tenants import fixed_usage
from tests.support.api import api_client
from tests.support.judge_server import JudgeServer, running_judge

KEYS = "a:key-a,b:key-b"
A, B = ({"Authorization": f"Bearer key-{t}"} for t in ("a", "b"))
AUDIT = {"judge": "same", "scope": {"group_ids": ["g0"]}}
#: One group's (or one audit of it's) judge usage, worked out above.
ONE = {"calls": 6, "judgments": 6, "prompt_tokens": 600, "completion_tokens": 60, "cached_prompt_tokens": 0}


@pytest.fixture
def auditor() -> Iterator[JudgeServer]:
    with running_judge(fixed_usage) as server:
        yield server


def service_for(
    database_url: str, judge: JudgeServer, auditor: JudgeServer, tenants: str, **overrides: Any
) -> AbstractContextManager[TestClient]:
    audit_judges = {"same": {"base_url": auditor.url, "model": "judge-a"}}
    return api_client(database_url, judge.url, api_keys=KEYS, tenants=tenants, audit_judges=audit_judges, **overrides)


def scored(client: TestClient, headers: dict[str, str], group_id: str) -> None:
    assert client.post("/v1/groups", json=three_rollouts(group_id, 0), headers=headers).status_code == 202
    r = client.get(f"/v1/groups/{group_id}/advantages", params={"wait": 60}, headers=headers)
    assert r.status_code == 200, r.text


def finished(client: TestClient, headers: dict[str, str], audit_id: str) -> tuple[int, dict[str, Any]]:
    r = client.get(f"/v1/audits/{audit_id}", params={"wait": 60}, headers=headers)
    body: dict[str, Any] = r.json()
    return r.status_code, body


def usage_of(client: TestClient, headers: dict[str, str]) -> dict[str, Any]:
    r = client.get("/v1/usage", headers=headers)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def next_midnight() -> datetime:
    return (datetime.now(UTC) + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)


def test_a_judge_audits_usage_adds_to_the_day_and_month_and_counts_in_the_budgets(
    database_url: str, auditor: JudgeServer
) -> None:
    tenants = '{"a": {"budget": {"tokens_per_day": 1000}}}'
    with running_judge(fixed_usage) as judge, service_for(database_url, judge, auditor, tenants) as c:
        scored(c, A, "g0")
        assert judge.count() == 6
        before = usage_of(c, A)
        for window in ("day", "month"):
            assert {k: before[window][k] for k in ONE} == ONE
        # 660 of 1000 used: the audit is admitted.
        posted = c.post("/v1/audits", json=AUDIT, headers=A)
        assert posted.status_code == 202 and posted.json()["status"] == "queued", posted.text
        assert posted.json()["waiting_for_budget"] is None
        status, report = finished(c, A, posted.json()["audit_id"])
        assert status == 200, report
        assert auditor.count() == 6
        assert {k: report["usage"][k] for k in ONE} == ONE
        after = usage_of(c, A)
        for window in ("day", "month"):
            assert {k: after[window][k] for k in ONE} == {k: 2 * v for k, v in ONE.items()}, window
        assert after["budgets"]["tokens_per_day"]["used"] == 1320
        assert usage_of(c, A)["day"] == after["day"]  # counted once, not again on a later read
        # The audit's tokens passed the budget: new work is refused, naming them.
        r = c.post("/v1/groups", json=three_rollouts("g1", 1), headers=A)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["used"] == 1320 and r.json()["error"]["limit"] == 1000
        # Another tenant's usage is its own.
        assert usage_of(c, B)["day"]["calls"] == 0


def test_an_audit_that_fails_after_its_calls_came_back_counts_them(
    database_url: str, auditor: JudgeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_report(*_: Any) -> Any:
        raise RuntimeError("report broke")

    # Embedded mode: the audit runs on a thread of this process, with this module patched.
    monkeypatch.setattr(service, "build_report", broken_report)
    with running_judge(fixed_usage) as judge, service_for(database_url, judge, auditor, "{}") as c:
        scored(c, A, "g0")
        posted = c.post("/v1/audits", json=AUDIT, headers=A)
        assert posted.status_code == 202, posted.text
        status, body = finished(c, A, posted.json()["audit_id"])
        assert status == 409 and body["status"] == "failed" and "report broke" in body["message"], body
        assert auditor.count() == 6
        day = usage_of(c, A)["day"]
        assert {k: day[k] for k in ONE} == {k: 2 * v for k, v in ONE.items()}


def test_a_judge_audit_past_a_budget_is_refused_with_the_groups_429(database_url: str, auditor: JudgeServer) -> None:
    tenants = '{"a": {"budget": {"tokens_per_day": 1}}}'
    with running_judge(fixed_usage) as judge, service_for(database_url, judge, auditor, tenants) as c:
        scored(c, A, "g0")  # admitted with nothing used; it uses 660
        r = c.post("/v1/audits", json=AUDIT, headers=A)
        assert r.status_code == 429, r.text
        midnight = next_midnight()
        assert r.json()["error"] == {
            "code": "budget_exhausted",
            "budget": "tokens_per_day",
            "limit": 1,
            "used": 660,
            "resets_at": midnight.isoformat(),
        }
        assert r.json()["detail"] == [{"field": "budget", "message": "budget tokens_per_day exhausted: used 660 of 1"}]
        retry = int(r.headers["retry-after"])
        assert abs(retry - math.ceil((midnight - datetime.now(UTC)).total_seconds())) <= 2
        # Nothing stored, no call made.
        assert c.get("/v1/audits", headers=A).json() == {"audits": []}
        assert auditor.count() == 0
        # An audit against people's labels calls no judge: no budget applies (here no
        # label exists, so it is the 422 that says so, not a 429).
        human = c.post("/v1/audits", json={"judge": "human", "scope": {"group_ids": ["g0"]}}, headers=A)
        assert human.status_code == 422, human.text
        assert human.json()["detail"][0]["field"] == "scope"
        # The OpenAPI document says so.
        spec = c.get("/openapi.json").json()
        assert "429" in spec["paths"]["/v1/audits"]["post"]["responses"]
        summary = spec["components"]["schemas"]["AuditSummary"]["properties"]
        assert {"$ref": "#/components/schemas/BudgetWait"} in summary["waiting_for_budget"]["anyOf"]
        # Another tenant is not held back.
        scored(c, B, "g0")
        posted = c.post("/v1/audits", json=AUDIT, headers=B)
        assert posted.status_code == 202, posted.text
        assert finished(c, B, posted.json()["audit_id"])[0] == 200


def test_with_wait_a_judge_audit_is_held_until_the_window_resets_then_runs_by_itself(
    database_url: str, auditor: JudgeServer
) -> None:
    tenants = '{"a": {"budget": {"tokens_per_day": 1}, "on_budget": "wait"}}'
    window = 8.0
    with (
        running_judge(fixed_usage) as judge,
        service_for(database_url, judge, auditor, tenants, budget_window_s=window) as c,
    ):
        scored(c, A, "g0")
        held: dict[str, Any] | None = None
        for _ in range(4):
            left = window - time.time() % window
            if left < 2.5:  # too near a reset to look at the hold before it ends
                time.sleep(left + 0.1)
            posted = c.post("/v1/audits", json=AUDIT, headers=A)
            assert posted.status_code == 202, posted.text
            if posted.json()["status"] == "waiting_for_budget":
                held = posted.json()
                break
            # The window reset since the group ended: this one runs, and uses up the next.
            assert finished(c, A, posted.json()["audit_id"])[0] == 200
        assert held is not None
        audit_id, wait = held["audit_id"], held["waiting_for_budget"]
        assert wait["budget"] == "tokens_per_day"
        resets_at = datetime.fromisoformat(wait["resets_at"])
        assert resets_at.timestamp() % window == 0 and resets_at > datetime.now(UTC)
        r = c.get(f"/v1/audits/{audit_id}", headers=A)
        assert r.status_code == 409 and r.json()["status"] == "waiting_for_budget", r.text
        assert "tokens_per_day is used up" in r.json()["message"]
        listed = {a["audit_id"]: a for a in c.get("/v1/audits", headers=A).json()["audits"]}
        assert listed[audit_id]["status"] == "waiting_for_budget"
        assert listed[audit_id]["waiting_for_budget"] == wait and listed[audit_id]["started_at"] is None
        before = auditor.count()
        time.sleep(max(0.0, (resets_at - datetime.now(UTC)).total_seconds() - 0.5))
        assert auditor.count() == before  # not a call before the reset
        # No other request than reading it: the release sends it at the reset.
        status, report = finished(c, A, audit_id)
        assert status == 200 and report["status"] == "done", report
        assert report["waiting_for_budget"] is None and auditor.count() == before + 6
        started = datetime.fromisoformat(report["started_at"])
        started = started if started.tzinfo else started.replace(tzinfo=UTC)
        assert resets_at <= started <= resets_at + timedelta(seconds=5)
