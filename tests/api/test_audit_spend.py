"""A judge audit's calls count in its tenant's usage as they come back, not only when the
audit ends (docs/api.md, "Tenants, shares and budgets"), over the real app on SQLite and
Postgres, in embedded mode (the audit runs on a thread of this process).

Worked by hand, as in ``test_audit_budgets``: every call is 100 prompt and 10 completion
tokens. The group ``g0`` is scored with 6 visit calls, and an audit of it makes another 6.
The audit judge here answers its first 3 calls at once and holds the other 3.

- While the audit runs, the tenant's day reads the group's 6 calls and the audit's 3:
  9 calls, 900 prompt and 90 completion tokens. When it ends it reads 12 calls, and a
  later read still reads 12 (counted once).
- An audit stopped with its process after 3 answered calls keeps them counted. The next
  start runs it again from the start (6 more calls), so the day reads 6 + 3 + 6 = 15
  calls. Its report counts its last run's 6.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from drcredit.audit import service
from tests.api.test_audit_budgets import AUDIT, KEYS, ONE, A, finished, scored, usage_of
from tests.api.test_tenants import PER_CALL, fixed_usage
from tests.support.api import api_client
from tests.support.judge_server import Call, JudgeServer, Reply, marker_answer, running_judge


def first_answered(answered: int, held_s: float) -> Callable[[Call], Reply]:
    """A script answering its first ``answered`` calls at once and holding the rest."""
    numbers = itertools.count(1)
    lock = threading.Lock()

    def script(call: Call) -> Reply:
        with lock:
            n = next(numbers)
        return Reply.json(marker_answer(call), usage=PER_CALL, delay=0.0 if n <= answered else held_s)

    return script


def day_of(client: TestClient) -> dict[str, Any]:
    day: dict[str, Any] = usage_of(client, A)["day"]
    return {k: day[k] for k in ONE}


def times(n: int) -> dict[str, int]:
    """``n`` calls' usage (each its own judgment)."""
    return {k: v * n // 6 for k, v in ONE.items()}


def wait_for_day(client: TestClient, expected: dict[str, int], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while day_of(client) != expected:
        assert time.monotonic() < deadline, (day_of(client), expected)
        time.sleep(0.05)


def app_with(database_url: str, judge: JudgeServer, auditor: JudgeServer) -> Any:
    audit_judges = {"same": {"base_url": auditor.url, "model": "judge-a"}}
    return api_client(database_url, judge.url, api_keys=KEYS, tenants="{}", audit_judges=audit_judges)


def test_a_running_audits_calls_count_as_they_come_back_and_once(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "COUNT_EVERY_S", 0.2)
    with (
        running_judge(fixed_usage) as judge,
        running_judge(first_answered(3, held_s=4.0)) as auditor,
        app_with(database_url, judge, auditor) as c,
    ):
        scored(c, A, "g0")
        assert day_of(c) == ONE
        posted = c.post("/v1/audits", json=AUDIT, headers=A)
        assert posted.status_code == 202, posted.text
        audit_id = posted.json()["audit_id"]
        # Its three answered calls count while the other three are still out.
        wait_for_day(c, {k: ONE[k] + times(3)[k] for k in ONE})
        assert c.get(f"/v1/audits/{audit_id}", headers=A).json()["status"] == "running"
        status, report = finished(c, A, audit_id)
        assert status == 200, report
        assert auditor.count() == 6
        assert {k: report["usage"][k] for k in ONE} == ONE
        assert day_of(c) == {k: 2 * v for k, v in ONE.items()}
        time.sleep(0.5)  # more counting rounds would add nothing: it is done
        assert day_of(c) == {k: 2 * v for k, v in ONE.items()}


def test_a_stopped_audits_answered_calls_stay_counted_and_its_next_run_counts_its_own(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "COUNT_EVERY_S", 0.2)
    with running_judge(fixed_usage) as judge:
        with running_judge(first_answered(3, held_s=8.0)) as stalling, app_with(database_url, judge, stalling) as c:
            scored(c, A, "g0")
            posted = c.post("/v1/audits", json=AUDIT, headers=A)
            assert posted.status_code == 202, posted.text
            audit_id = posted.json()["audit_id"]
            wait_for_day(c, {k: ONE[k] + times(3)[k] for k in ONE})
            # The process stops here, with three calls still out.
        with running_judge(fixed_usage) as answering, app_with(database_url, judge, answering) as c:
            status, report = finished(c, A, audit_id)
            assert status == 200, report
            assert answering.count() == 6  # run again from the start
            assert {k: report["usage"][k] for k in ONE} == ONE  # the report is its last run's
            assert day_of(c) == {k: ONE[k] + times(3)[k] + ONE[k] for k in ONE}
