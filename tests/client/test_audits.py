"""Judge audits through the SDK, sync and async, against the real service (SQLite file,
the marker judge) with audit judges served here: the marker script again ("same"), one
that says level 1 where the marker says 2 ("shifted", the hand-worked figures of
tests/api/test_audits.py), a slow one and one nobody serves ("down")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from drcredit.client import (
    AuditFailed,
    DrCreditTimeout,
    InvalidRequest,
    NotFound,
    NotReady,
    ServerError,
)
from tests.api.test_audits import shifted, three_rollouts
from tests.client.conftest import Connect, flaky_proxy, running_service
from tests.support.judge_server import Call, JudgeServer, Reply, marker_answer, running_judge
from tests.support.live import free_port

FAST = {"max_attempts": 3, "backoff_initial": 0.01, "backoff_max": 0.02}


def slow(call: Call) -> Reply:
    # long enough that a loaded machine cannot finish the audit between the test's two looks
    return Reply.json(marker_answer(call), delay=4.0)


@pytest.fixture
def audited_service(tmp_path: Path, marker_judge: JudgeServer) -> Iterator[str]:
    """The service with three done groups of run ``exp`` (batch ``b1`` holds g0 and g1)."""
    with (
        running_judge(lambda c: Reply.json(marker_answer(c))) as same,
        running_judge(shifted) as shift,
        running_judge(slow) as slowly,
    ):
        judges: dict[str, Any] = {
            "same": {"base_url": same.url, "model": "judge-test"},
            "shifted": {"base_url": shift.url, "model": "judge-b"},
            "slow": {"base_url": slowly.url, "model": "judge-s", "timeout_s": 60},
            "down": {
                "base_url": f"http://127.0.0.1:{free_port()}/v1",
                "model": "judge-c",
                "max_attempts": 1,
                "outage_deadline_s": 1.0,
            },
        }
        with running_service(tmp_path, marker_judge.url, audit_judges=judges, api_keys="t1:k1,t2:k2") as url:
            with httpx.Client(base_url=url, headers={"Authorization": "Bearer k1"}, timeout=60) as c:
                body = {"batch_id": "b1", "groups": [three_rollouts("g0", 0), three_rollouts("g1", 1)]}
                assert c.post("/v1/batches", json=body).status_code == 202
                assert c.post("/v1/groups", json=three_rollouts("g2", 2)).status_code == 202
                for gid in ("g0", "g1", "g2"):
                    assert c.get(f"/v1/groups/{gid}/advantages", params={"wait": 60}).status_code == 200
            yield url


def test_an_audit_started_waited_for_and_listed(audited_service: str, connect: Connect) -> None:
    client = connect(audited_service, api_key="k1")
    started = client.start_audit("shifted", group_ids=["g0"])
    assert started["status"] == "queued" and started["judge"] == "shifted" and started["judge_model"] == "judge-b"
    assert started["scope"] == {"group_ids": ["g0"]} and started["group_ids"] == ["g0"] and started["seed"] == 0
    report = client.wait_for_audit(started["audit_id"], timeout=60, poll_wait=5)
    assert report["status"] == "done" and report["audit_id"] == started["audit_id"]
    # The figures worked by hand in tests/api/test_audits.py: 4 of 6 visit pairs equal,
    # kappa 1 - (1/12) / (1/4).
    visit = report["agreement"]["visit"]
    assert visit["pairs"] == 6 and visit["exact"] == pytest.approx(4 / 6)
    assert visit["confusion"] == [[2, 0, 0], [0, 2, 0], [0, 2, 0]]
    assert visit["kappa"] == pytest.approx(2 / 3)
    assert report["effect"]["process_sign_agreement"] == pytest.approx(2 / 3)
    assert client.get_audit(started["audit_id"]) == report == client.get_audit(started["audit_id"], wait=5)
    listed = client.list_audits(run="exp")
    assert [a["audit_id"] for a in listed] == [started["audit_id"]]
    assert listed[0]["agreement"] == report["agreement"]
    assert listed[0]["effect"] == {k: v for k, v in report["effect"].items() if k != "groups"}
    assert listed[0]["usage"] == report["usage"]
    assert client.list_audits(run="other") == []
    # Another tenant sees none of it.
    other = connect(audited_service, api_key="k2")
    assert other.list_audits() == []
    with pytest.raises(NotFound) as err:
        other.get_audit(started["audit_id"])
    assert err.value.message == f"audit {started['audit_id']!r} not found"


def test_scopes_sample_and_seed(audited_service: str, connect: Connect) -> None:
    client = connect(audited_service, api_key="k1")
    by_run = client.start_audit("same", run="exp", sample_groups=2, seed=11)
    again = client.start_audit("same", run="exp", sample_groups=2, seed=11)
    assert len(by_run["group_ids"]) == 2 and again["group_ids"] == by_run["group_ids"]
    assert by_run["sample_groups"] == 2 and by_run["seed"] == 11 and by_run["scope"] == {"run": "exp"}
    by_batch = client.start_audit("same", batch_id="b1")
    assert by_batch["group_ids"] == ["g0", "g1"] and by_batch["scope"] == {"batch_id": "b1"}
    report = client.wait_for_audit(by_batch["audit_id"], timeout=60)
    # The same judge twice: every visit pair equal (2 groups x 3 rollouts x 2 rubrics).
    assert report["agreement"]["visit"]["pairs"] == 12 and report["agreement"]["visit"]["kappa"] == 1.0
    assert [g["group_id"] for g in report["effect"]["groups"]] == ["g0", "g1"]
    newest_first = [a["audit_id"] for a in client.list_audits()]
    assert newest_first == [by_batch["audit_id"], again["audit_id"], by_run["audit_id"]]


def test_bad_requests_name_the_field(audited_service: str, connect: Connect) -> None:
    client = connect(audited_service, api_key="k1")
    with pytest.raises(InvalidRequest) as err:
        client.start_audit("gpt-9", run="exp")
    assert err.value.errors == [
        {"field": "judge", "message": "no audit judge named 'gpt-9' (known: down, same, shifted, slow)"}
    ]
    with pytest.raises(InvalidRequest) as err:
        client.start_audit("same")
    assert err.value.fields == ["scope"] and "got none" in err.value.errors[0]["message"]
    with pytest.raises(InvalidRequest) as err:
        client.start_audit("same", run="exp", batch_id="b1")
    assert err.value.fields == ["scope"]
    with pytest.raises(InvalidRequest) as err:
        client.start_audit("same", group_ids=["g0", "nope"])
    assert err.value.errors == [{"field": "scope.group_ids[1]", "message": "no group 'nope'"}]
    with pytest.raises(NotFound):
        client.start_audit("same", run="nope")
    with pytest.raises(TypeError):
        client.start_audit("same", group_ids="g0")  # type: ignore[arg-type]
    for call in (lambda: client.get_audit("aud-nope"), lambda: client.wait_for_audit("aud-nope", timeout=5)):
        with pytest.raises(NotFound):
            call()
    with pytest.raises(ValueError):
        client.get_audit("aud-nope", wait=-1)


def test_a_failed_audit_raises_with_its_reason(audited_service: str, connect: Connect) -> None:
    client = connect(audited_service, api_key="k1")
    started = client.start_audit("down", group_ids=["g0"])
    with pytest.raises(AuditFailed) as err:
        client.wait_for_audit(started["audit_id"], timeout=60)
    assert err.value.audit_id == started["audit_id"]
    assert "unreachable" in err.value.reason and "outage deadline" in err.value.reason
    assert not err.value.reason.startswith("audit ")  # the reason alone; the message has it all
    assert str(err.value) == f"audit {started['audit_id']!r} is failed: {err.value.reason}"
    with pytest.raises(NotReady) as not_ready:
        client.get_audit(started["audit_id"])
    assert not_ready.value.status == "failed"
    listed = client.list_audits()[0]
    assert listed["status"] == "failed" and listed["error"] == err.value.reason and "agreement" not in listed


def test_waiting_runs_out_of_time_with_the_status(audited_service: str, connect: Connect) -> None:
    client = connect(audited_service, api_key="k1")
    started = client.start_audit("slow", group_ids=["g0"])
    with pytest.raises(DrCreditTimeout) as err:
        client.wait_for_audit(started["audit_id"], timeout=0.5, poll_wait=0.2)
    assert err.value.status in ("queued", "running")
    assert f"audit {started['audit_id']!r} not finished after 0.5s" in str(err.value)
    with pytest.raises(NotReady):
        client.get_audit(started["audit_id"], wait=0)
    assert client.wait_for_audit(started["audit_id"], timeout=60, progress=True)["status"] == "done"


def test_starting_an_audit_is_never_retried(audited_service: str, connect: Connect) -> None:
    """A lost answer to a POST may have started the audit: retrying would start a second
    one and pay the audit judge twice, so the error reaches the caller at once."""
    with flaky_proxy(audited_service, {("POST", "/v1/audits"): 5}) as (url, proxy):
        client = connect(url, api_key="k1", **FAST)
        with pytest.raises(ServerError) as err:
            client.start_audit("same", run="exp")
        assert err.value.attempts == 1 and proxy.seen["POST", "/v1/audits"] == 1
        # Reads are retried as every GET is.
        with flaky_proxy(audited_service, {("GET", "/v1/audits"): 2}) as (url2, proxy2):
            assert connect(url2, api_key="k1", **FAST).list_audits() == []
            assert proxy2.seen["GET", "/v1/audits"] == 3
