"""The client SDK against the real service, served by uvicorn on a real port.

Nothing of the client is mocked: every test talks HTTP to ``create_app(settings)`` running
in a background thread (SQLite file, the marker judge). Tests taking the ``connect``
fixture run twice, with :class:`DrCreditClient` and with :class:`AsyncDrCreditClient`
(driven through one ``asyncio.Runner`` per client); ``test_async_concurrent_streaming``
uses the async client natively. Retries are checked against a small proxy that answers
503 to the first requests of a path and forwards the rest to the real service.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from drcredit.client import (
    AsyncDrCreditClient,
    AuthError,
    Conflict,
    DrCreditConnectionError,
    DrCreditError,
    DrCreditTimeout,
    GroupFailed,
    InvalidRequest,
    NotFound,
    NotReady,
    PayloadTooLarge,
    ServerError,
    new_group_id,
)
from drcredit.domain.group import GroupIn
from tests.client.conftest import Connect, flaky_proxy, running_service
from tests.support.builders import answer, group_doc, page, rollout, visit
from tests.support.judge_server import JudgeServer, Reply, running_judge
from tests.support.live import free_port
from tests.support.scenarios import CREDITS, RUBRICS, hand_worked_group, rollout_a, rollout_b

ID = re.compile(r"^[A-Za-z0-9\-_.:]{1,128}$")
FAST = {"max_attempts": 3, "backoff_initial": 0.01, "backoff_max": 0.02}


def small_group(**extra: Any) -> dict[str, Any]:
    return hand_worked_group(**extra)


def credits_of(doc: dict[str, Any]) -> dict[str, list[float | None]]:
    return {r["id"]: [t["credit"] for t in r["turns"]] for r in doc["rollouts"]}


def approx_credits() -> dict[str, list[Any]]:
    return {k: [None if c is None else pytest.approx(c) for c in v] for k, v in CREDITS.items()}


# ---------------------------------------------------------------------------- ingest and results


def test_submit_resubmit_and_conflict(service: str, marker_judge: JudgeServer, connect: Connect) -> None:
    client = connect(service)
    accepted = client.submit_group(small_group(), group_id="run7-step42-q17", metadata={"run": "r7", "step": 42})
    assert accepted["group_id"] == "run7-step42-q17" and accepted["status"] == "queued" and accepted["created"]
    doc = client.wait_for_advantages("run7-step42-q17", timeout=30)
    assert doc["status"] == "done" and doc["metadata"] == {"run": "r7", "step": 42}
    assert credits_of(doc) == approx_credits()
    final = doc["rollouts"][0]["turns"][-1]
    assert final["type"] == "answer" and final["advantage"] == doc["rollouts"][0]["outcome_advantage"]
    calls = marker_judge.count()
    again = client.submit_group(small_group(group_id="run7-step42-q17"))
    assert again["created"] is False and again["status"] == "done" and marker_judge.count() == calls
    with pytest.raises(Conflict) as err:
        client.submit_group(small_group(), group_id="run7-step42-q17", params={"cap": 0.5})
    assert err.value.status_code == 409 and "different content" in err.value.message
    assert "different content" in str(err.value)


def test_submit_pydantic_model_gets_a_generated_id(service: str, connect: Connect) -> None:
    client = connect(service)
    model = GroupIn.model_validate(small_group(params={"cap": 0.9}))
    accepted = client.submit_group(model)
    gid = accepted["group_id"]
    assert ID.match(gid) and accepted["created"] is True
    doc = client.advantages(gid, wait=30)
    assert doc["params"]["cap"] == 0.9 and credits_of(doc)["b"] == [pytest.approx(c) for c in CREDITS["b"]]
    # The service's failure policy applies: a model's unset defaults are not sent.
    assert doc["params"]["on_judge_failure"] == "zero"
    with pytest.raises(ValueError, match="differs"):
        client.submit_group(small_group(group_id="one"), group_id="other")


def test_streaming_open_group_and_add_rollout(service: str, connect: Connect) -> None:
    client = connect(service)
    opened = client.open_group("What happened?", RUBRICS, 3, group_id="stream-1", rollouts=[rollout_a()])
    assert opened["group_id"] == "stream-1" and opened["created"] is True
    added = client.add_rollout("stream-1", rollout_b())
    assert added["rollouts_received"] == 2 and added["expected_rollouts"] == 3 and added["created"] is True
    assert client.add_rollout("stream-1", rollout_b())["created"] is False
    with pytest.raises(Conflict):
        client.add_rollout("stream-1", {**rollout_b(), "outcome_reward": 0.9})
    with pytest.raises(NotReady) as err:
        client.advantages("stream-1", wait=0.5)
    assert err.value.status in ("queued", "running") and err.value.status_code == 409
    third = rollout("c", visit(page("W1", "https://z.org", "[R1:1:h]")), answer(), reward=0.5)
    client.add_rollout("stream-1", third)
    doc = client.wait_for_advantages("stream-1", timeout=30, poll_wait=5)
    assert [r["id"] for r in doc["rollouts"]] == ["a", "b", "c"]
    # Re-opening with the same content is idempotent, like any re-post.
    assert (
        client.open_group("What happened?", RUBRICS, 3, group_id="stream-1", rollouts=[rollout_a()])["created"] is False
    )


def test_batch_submit_wait_and_advantages(
    service: str, connect: Connect, marker_judge: JudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    client = connect(service)
    groups = [small_group(group_id="q1"), small_group(group_id="q2", params={"cap": 0.5})]
    accepted = client.submit_batch(groups, batch_id="step-1")
    assert accepted["batch_id"] == "step-1" and accepted["group_ids"] == ["q1", "q2"] and accepted["created"]
    done = client.wait_for_batch("step-1", timeout=30, progress=True)
    assert done["status"] == "done" and [g["group_id"] for g in done["groups"]] == ["q1", "q2"]
    assert "batch step-1" in capsys.readouterr().err
    assert credits_of(done["groups"][0]) == approx_credits()
    assert client.batch_advantages("step-1")["groups"][1]["params"]["cap"] == 0.5
    status = client.batch_status("step-1")
    assert status["status"] == "done" and [g["status"] for g in status["groups"]] == ["done", "done"]
    calls = marker_judge.count()
    assert client.submit_batch(groups, batch_id="step-1")["created"] is False and marker_judge.count() == calls
    with pytest.raises(Conflict):
        client.submit_batch(groups[:1], batch_id="step-1")
    generated = client.submit_batch([small_group(group_id="q3")])
    assert ID.match(generated["batch_id"]) and generated["group_ids"] == ["q3"]
    assert client.batch_advantages(generated["batch_id"], wait=30)["status"] == "done"


def test_advantages_credits_replay_and_status(
    service: str, connect: Connect, marker_judge: JudgeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    client = connect(service)
    client.submit_group(small_group(), group_id="g1")
    waited = client.wait_for_advantages("g1", timeout=30, progress=True)
    assert "group g1" in capsys.readouterr().err
    assert client.advantages("g1", wait=30) == waited == client.advantages("g1")
    status = client.group_status("g1")
    assert status["status"] == "done" and status["progress"]["judgments_done"] == 8
    assert status["progress"]["judgments_total"] == 8 and status["finished_at"] is not None
    breakdown = client.credits("g1", wait=5)
    first_visit = breakdown["rollouts"][0]["turns"][1]
    assert {j["rubric_id"]: j["level"] for j in first_visit["judgments"]} == {"R1": 2, "R2": 1}
    calls = marker_judge.count()
    same = client.replay("g1", {})
    assert same["exact"] is True and same["sensitivity"]["rmse"] == 0
    other = client.replay("g1", {"visit_levels": [0, 0.25, 0.5], "snippet_weight": 0.3})
    assert credits_of(other)["a"] == [1.0, 0.75, 0.0, None] and marker_judge.count() == calls
    with pytest.raises(InvalidRequest) as err:
        client.replay("g1", {"history": False})
    assert err.value.fields == ["params.history"]


def test_ids_that_are_path_specials(service: str, connect: Connect) -> None:
    """``:`` is a valid id character, kept in one path segment; ``.`` and ``..`` are refused
    by the server (HTTP clients resolve them away, so such a group could not be read back)."""
    client = connect(service)
    client.submit_group(small_group(), group_id="a:b")
    assert client.wait_for_advantages("a:b", timeout=30)["group_id"] == "a:b"
    assert client.group_status("a:b")["group_id"] == "a:b"
    for gid in ("..", "."):
        with pytest.raises(InvalidRequest) as err:
            client.submit_group(small_group(), group_id=gid)
        assert err.value.fields == ["group_id"]


def test_operations(service: str, connect: Connect) -> None:
    client = connect(service)
    assert client.healthz() == {"status": "ok"}
    ready = client.readyz()
    assert ready["status"] == "ready" and ready["database"] == "ok"
    client.submit_group(small_group(), group_id="ops")
    client.wait_for_advantages("ops", timeout=30)
    text = client.metrics()
    assert isinstance(text, str) and 'drcredit_groups{status="done"}' in text


# ---------------------------------------------------------------------------- errors


def test_not_found(service: str, connect: Connect) -> None:
    client = connect(service)
    with pytest.raises(NotFound) as err:
        client.group_status("nope")
    assert err.value.status_code == 404 and err.value.message == "group 'nope' not found"
    assert err.value.body == {
        "message": "group 'nope' not found",
        "detail": [{"field": "group_id", "message": "group 'nope' not found"}],
    }
    calls: list[Callable[[], Any]] = [
        lambda: client.advantages("nope", wait=0),
        lambda: client.credits("nope"),
        lambda: client.replay("nope", {}),
        lambda: client.add_rollout("nope", rollout("x", answer())),
        lambda: client.batch_status("nope"),
        lambda: client.batch_advantages("nope"),
        lambda: client.wait_for_advantages("nope", timeout=5),
        lambda: client.wait_for_batch("nope", timeout=5),
    ]
    for call in calls:
        with pytest.raises(NotFound):
            call()


def test_invalid_request_names_the_field(service: str, connect: Connect) -> None:
    client = connect(service)
    with pytest.raises(InvalidRequest) as err:
        client.submit_group(group_doc(rollout_a(), {**rollout_b(), "id": "a"}, rubrics=RUBRICS))
    assert err.value.status_code == 422 and err.value.fields == ["rollouts[1].id"]
    assert err.value.errors == [{"field": "rollouts[1].id", "message": "duplicate rollout id a (first at rollouts[0])"}]
    assert "rollouts[1].id: duplicate rollout id a (first at rollouts[0])" in str(err.value).splitlines()
    with pytest.raises(InvalidRequest) as err:
        client.submit_group(small_group(), params={"bogus": 1})
    assert err.value.fields == ["params.bogus"]
    doc = small_group()
    doc["rollouts"][0]["turns"][0]["results"][1]["id"] = "S1"
    with pytest.raises(InvalidRequest) as err:
        client.submit_batch([small_group(group_id="ok"), doc])
    assert err.value.fields == ["groups[1].rollouts[0].turns[0].results[1].id"]
    with pytest.raises(NotFound):
        client.group_status("ok")  # nothing of a rejected batch is stored


def test_payload_too_large(tmp_path: Path, marker_judge: JudgeServer, connect: Connect) -> None:
    with running_service(tmp_path, marker_judge.url, max_body_bytes=2048) as url:
        client = connect(url)
        with pytest.raises(PayloadTooLarge) as err:
            client.submit_group(small_group(question="x" * 5000))
        assert err.value.status_code == 413 and "2048" in err.value.message
        assert client.submit_group(small_group())["created"] is True


def test_api_keys(tmp_path: Path, marker_judge: JudgeServer, connect: Connect, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_service(tmp_path, marker_judge.url, api_keys="t1:k1") as url:
        for wrong in (connect(url, api_key="nope"), connect(url)):
            assert wrong.healthz() == {"status": "ok"}
            with pytest.raises(AuthError) as err:
                wrong.submit_group(small_group(), group_id="g1")
            assert err.value.status_code == 401
            assert err.value.message == "missing or invalid API key: send Authorization: Bearer <key>"
        right = connect(url, api_key="k1")
        right.submit_group(small_group(), group_id="g1")
        assert right.wait_for_advantages("g1", timeout=30)["status"] == "done"
        monkeypatch.setenv("DRCREDIT_URL", url)
        monkeypatch.setenv("DRCREDIT_API_KEY", "k1")
        from_env = connect()
        assert from_env.base_url == url and from_env.group_status("g1")["status"] == "done"
        # An explicit key wins over the environment.
        with pytest.raises(AuthError):
            connect(api_key="nope").group_status("g1")


def test_wait_timeout(tmp_path: Path, connect: Connect) -> None:
    def slow(call: Any) -> Reply:
        body = {"matches": []} if call.kind == "snippet" else {"level": 0, "page_ids": [], "support_points": []}
        return Reply.json(body, delay=1.5)

    with running_judge(slow) as judge, running_service(tmp_path, judge.url) as url:
        client = connect(url)
        client.submit_group(small_group(), group_id="slow")
        started = time.monotonic()
        with pytest.raises(DrCreditTimeout) as err:
            client.wait_for_advantages("slow", timeout=0.4, poll_wait=0.2)
        elapsed = time.monotonic() - started
        assert 0.4 <= elapsed < 2.5, elapsed  # the group needs at least 3 s of judge delays
        assert isinstance(err.value, TimeoutError) and err.value.status in ("queued", "running")
        assert err.value.document is not None and err.value.document["group_id"] == "slow"
        assert "not finished after 0.4s" in str(err.value)
        client.submit_batch([small_group(group_id="slow-2")], batch_id="slow-batch")
        with pytest.raises(DrCreditTimeout) as err:
            client.wait_for_batch("slow-batch", timeout=0.3)
        assert err.value.status in ("queued", "running") and err.value.document is not None
        with pytest.raises(DrCreditTimeout):
            client.wait_for_advantages("slow", timeout=0)
        assert client.wait_for_advantages("slow", timeout=60)["status"] == "done"


def test_group_failed(tmp_path: Path, connect: Connect) -> None:
    with running_judge(lambda call: Reply(content="no idea")) as judge, running_service(tmp_path, judge.url) as url:
        client = connect(url)
        client.submit_group(small_group(params={"on_judge_failure": "fail"}), group_id="bad")
        with pytest.raises(GroupFailed) as err:
            client.wait_for_advantages("bad", timeout=30)
        assert err.value.group_ids == ["bad"] and "judgment failed" in err.value.message
        client.submit_batch(
            [small_group(group_id="fine"), small_group(group_id="bad-2", params={"on_judge_failure": "fail"})],
            batch_id="mixed",
        )
        with pytest.raises(GroupFailed) as failed:
            client.wait_for_batch("mixed", timeout=30)
        assert failed.value.group_ids == ["bad-2"] and failed.value.document is not None
        assert failed.value.document["groups"][0]["status"] == "done"


# ---------------------------------------------------------------------------- retries


def test_retries_5xx_then_succeeds(service: str, connect: Connect) -> None:
    failures = {("POST", "/v1/groups"): 2, ("GET", "/v1/groups/r1"): 2, ("POST", "/v1/batches"): 1}
    with flaky_proxy(service, failures) as (url, proxy):
        client = connect(url, **FAST)
        accepted = client.submit_group(small_group())  # no id given: one is made before the first try
        assert accepted["created"] is True and proxy.seen["POST", "/v1/groups"] == 3
        sent = {json.loads(b)["group_id"] for b in proxy.bodies}
        assert sent == {accepted["group_id"]}
        client.submit_group(small_group(), group_id="r1")
        assert client.group_status("r1")["group_id"] == "r1" and proxy.seen["GET", "/v1/groups/r1"] == 3
        assert client.submit_batch([small_group(group_id="r2")])["group_ids"] == ["r2"]
        assert proxy.seen["POST", "/v1/batches"] == 2
        # 4xx answers are never retried.
        with pytest.raises(NotFound):
            client.group_status("absent")
        assert proxy.seen["GET", "/v1/groups/absent"] == 1
        with pytest.raises(InvalidRequest):
            client.submit_group(small_group(), params={"bogus": 1})
        assert proxy.seen["POST", "/v1/groups"] == 5


def test_persistent_5xx_is_server_error(service: str, connect: Connect) -> None:
    with flaky_proxy(service, {("GET", "/healthz"): 100}) as (url, proxy):
        client = connect(url, **FAST)
        with pytest.raises(ServerError) as err:
            client.healthz()
        assert err.value.status_code == 503 and err.value.attempts == 3 and proxy.seen["GET", "/healthz"] == 3
        assert err.value.message == "warming up (3)"


def test_connection_refused(connect: Connect) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    client = connect(url, **FAST)
    for call in (client.healthz, lambda: client.submit_group(small_group())):
        with pytest.raises(DrCreditConnectionError) as err:
            call()
        assert err.value.attempts == 3 and isinstance(err.value, ConnectionError)
        assert isinstance(err.value, DrCreditError) and url in str(err.value)
    single = connect(url, max_attempts=1)
    with pytest.raises(DrCreditConnectionError) as err:
        single.healthz()
    assert err.value.attempts == 1


# ---------------------------------------------------------------------------- async natively


def test_async_concurrent_streaming(service: str) -> None:
    async def main() -> None:
        async with AsyncDrCreditClient(service, timeout=10) as client:
            await client.open_group("What happened?", RUBRICS, 2, group_id="astream")
            added = await asyncio.gather(
                client.add_rollout("astream", rollout_a()), client.add_rollout("astream", rollout_b())
            )
            assert sorted(a["rollout_id"] for a in added) == ["a", "b"]
            ids = [new_group_id("async") for _ in range(3)]
            await asyncio.gather(*(client.submit_group(small_group(), group_id=g) for g in ids))
            docs = await asyncio.gather(
                client.wait_for_advantages("astream", timeout=30),
                *(client.wait_for_advantages(g, timeout=30) for g in ids),
            )
            assert all(credits_of(d) == approx_credits() for d in docs)
            with pytest.raises(NotFound):
                await client.credits("nope")

    asyncio.run(main())


# ---------------------------------------------------------------------------- helpers


def test_new_group_id() -> None:
    ids = {new_group_id("run7-step42") for _ in range(100)}
    assert len(ids) == 100 and all(ID.match(i) and i.startswith("run7-step42-") for i in ids)
    assert ID.match(new_group_id()) and len(new_group_id()) == 32
    assert len(new_group_id("x" * 95)) == 128
    for bad in ("x" * 96, "has space", "a/b"):
        with pytest.raises(ValueError):
            new_group_id(bad)


def test_wait_arguments_are_checked(connect: Connect) -> None:
    client = connect("http://127.0.0.1:1")
    with pytest.raises(ValueError):
        client.advantages("g", wait=-1)
    with pytest.raises(ValueError):
        client.wait_for_advantages("g", timeout=-1)
    with pytest.raises(ValueError):
        client.advantages("g", wait=math.nan)


def test_a_retried_batch_of_groups_without_ids_is_judged_once(
    service: str, connect: Connect, marker_judge: JudgeServer, tmp_path: Path
) -> None:
    """The first POST is stored but its answer lost; the retry carries the same group ids
    (given before the first attempt), so the service stores and judges each group once."""
    groups = [small_group(), small_group(question="Another question?")]
    with flaky_proxy(service, {("POST", "/v1/batches"): 1}, lose_answers=True) as (url, proxy):
        client = connect(url, **FAST)
        accepted = client.submit_batch(groups, batch_id="retried")
        assert proxy.seen[("POST", "/v1/batches")] == 2
        first, second = (json.loads(b) for b in proxy.bodies if b)
        assert [g["group_id"] for g in first["groups"]] == [g["group_id"] for g in second["groups"]]
        assert all(ID.match(g["group_id"]) for g in first["groups"])
        assert accepted["created"] is False and accepted["group_ids"] == [g["group_id"] for g in first["groups"]]
        doc = client.wait_for_batch("retried", timeout=60)
    assert len(doc["groups"]) == 2
    calls = marker_judge.count()
    # What one post of the same groups costs, on a service of its own: the first service
    # would answer them from its store of the tenant's earlier answers, at no cost.
    (tmp_path / "once").mkdir()
    with running_service(tmp_path / "once", marker_judge.url) as fresh:
        single = connect(fresh, **FAST)
        single.submit_batch(groups, batch_id="once")
        single.wait_for_batch("once", timeout=60)
    assert marker_judge.count() - calls == calls  # the retried batch cost what one post costs


def test_wait_warns_when_judgments_failed(tmp_path: Path, connect: Connect) -> None:
    from drcredit.client import JudgmentsFailed, failed_judgments, unscorable_turns

    with running_judge(lambda c: Reply(content="no json")) as bad, running_service(tmp_path, bad.url) as url:
        client = connect(url)
        client.submit_group(small_group(), group_id="f1")
        with pytest.warns(JudgmentsFailed, match="judgment"):
            doc = client.wait_for_advantages("f1", timeout=60)
    assert failed_judgments(doc) == doc["progress"]["judgments_failed"] > 0
    turns = unscorable_turns(doc)
    assert turns and all(g == "f1" for g, _, _ in turns)
    flagged = {(r, i) for _, r, i in turns}
    for r in doc["rollouts"]:
        for t in r["turns"]:
            assert t["unscorable"] == ((r["id"], t["index"]) in flagged)
