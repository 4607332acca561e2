"""Identical judge requests answered from the tenant's store of earlier answers
(docs/judges.md, "Reuse"), end to end over the API with a scripted judge over HTTP.

A group posted again under a new id (a later step with the same questions and pages)
asks the judge nothing: every judgment is ``reused``, with no call and no tokens, and
the advantages are the first post's. Another tenant, ``group`` and ``off`` modes, an
audit, and a store that cannot be read each ask the judge again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text, update

from drcredit.settings import Settings
from drcredit.storage import models as m
from drcredit.storage.database import Database, utcnow
from tests.support.api import api_client
from tests.support.builders import group_doc, page, rollout, rubric, search, visit
from tests.support.judge_server import JudgeServer

KEYS = "alpha:key-a,beta:key-b"


def group(group_id: str) -> dict[str, Any]:
    a = rollout(
        "a",
        search(("S1", "https://x.org/1", "a snippet [R1]")),
        visit(page("W1", "https://u1.org/p", "[R1:2:f1] text")),
        visit(page("W2", "https://u2.org/p", "[R2:1:g1] more")),
        reward=1.0,
    )
    b = rollout("b", visit(page("W1", "https://u3.org/p", "[R1:1:f2] other")), reward=0.0)
    return group_doc(a, b, rubrics=[rubric("R1", 1.0), rubric("R2", 2.0)], group_id=group_id)


def scored(client: TestClient, doc: dict[str, Any], key: str = "key-a") -> dict[str, Any]:
    headers = {"authorization": f"Bearer {key}"}
    assert client.post("/v1/groups", json=doc, headers=headers).status_code == 202
    r = client.get(f"/v1/groups/{doc['group_id']}/advantages", params={"wait": 60}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def credits(client: TestClient, group_id: str, key: str = "key-a") -> list[dict[str, Any]]:
    doc = client.get(f"/v1/groups/{group_id}/credits", headers={"authorization": f"Bearer {key}"}).json()
    return [j for r in doc["rollouts"] for t in r["turns"] for j in t.get("judgments", ())]


def advantages(doc: dict[str, Any]) -> list[Any]:
    """Each rollout's turns (advantages and credits), its usage left out."""
    return [(r["id"], r["turns"], r.get("outcome_advantage")) for r in doc["rollouts"]]


def reused_metric(client: TestClient) -> dict[str, float]:
    """drcredit_judge_reused_total by kind (the process's registry: read as differences)."""
    families = text_string_to_metric_families(client.get("/metrics", headers={"authorization": "Bearer key-a"}).text)
    return {
        sample.labels["kind"]: sample.value
        for family in families
        for sample in family.samples
        if sample.name == "drcredit_judge_reused_total"
    }


@pytest.fixture
def client(database_url: str, marker_judge: JudgeServer) -> Iterator[TestClient]:
    with api_client(database_url, marker_judge.url, api_keys=KEYS) as c:
        yield c


def test_a_group_posted_again_under_a_new_id_reuses_every_answer(client: TestClient, marker_judge: JudgeServer) -> None:
    first = scored(client, group("step1"))
    asked = marker_judge.count()
    assert asked > 0 and first["usage"]["reused"] == 0
    before = reused_metric(client)
    again = scored(client, group("step2"))
    assert marker_judge.count() == asked  # not one call more
    # Kinds other tests of this process reused before stay in the registry: differences only.
    counted = {k: d for k, v in reused_metric(client).items() if (d := v - before.get(k, 0.0))}
    assert counted == {kind: float(marker_judge.count(kind)) for kind in ("visit", "snippet")}
    assert advantages(again) == advantages(first)
    usage = again["usage"]
    judged = [j for j in credits(client, "step2") if j["status"] == "ok"]
    assert usage["reused"] == len(judged) == asked
    assert usage["calls"] == 0 and usage["prompt_tokens"] == 0 and usage["cached_prompt_share"] is None
    for j in judged:
        assert j["reused"] is True and j["cache_hit"] is True and j["attempts"] == []
        assert j["prompt_tokens"] == 0 and j["prompt_layout"] == "shared-first-v1"
    per_rollout = client.get("/v1/groups/step2/credits", headers={"authorization": "Bearer key-a"}).json()
    for r in again["rollouts"]:
        stored = next(x for x in per_rollout["rollouts"] if x["id"] == r["id"])
        reused = sum(1 for t in stored["turns"] for j in t.get("judgments", ()) if j["reused"])
        assert r["usage"]["reused"] == reused > 0 and r["usage"]["prompt_tokens"] == 0
    assert all(j["reused"] is False for j in credits(client, "step1"))


def test_another_tenant_does_not_reuse(client: TestClient, marker_judge: JudgeServer) -> None:
    scored(client, group("g"), "key-a")
    asked = marker_judge.count()
    doc = scored(client, group("g"), "key-b")
    assert marker_judge.count() == 2 * asked
    assert doc["usage"]["reused"] == 0


@pytest.mark.parametrize("mode", ["group", "off"])
def test_group_and_off_modes_ask_again(database_url: str, marker_judge: JudgeServer, mode: str) -> None:
    with api_client(database_url, marker_judge.url, judge_reuse=mode) as client:
        scored(client, group("one"))
        asked = marker_judge.count()
        doc = scored(client, group("two"))
        assert marker_judge.count() == 2 * asked and doc["usage"]["reused"] == 0
        with Database(database_url).session() as s:
            assert s.query(m.JudgeAnswer).count() == 0


def twins() -> dict[str, Any]:
    # Two rollouts visiting the same page with the same (empty) history: identical requests.
    a = rollout("a", visit(page("W1", "https://u1.org/p", "[R1:2:f1] text")), reward=1.0)
    b = rollout("b", visit(page("W1", "https://u1.org/p", "[R1:2:f1] text")), reward=0.0)
    return group_doc(a, b, rubrics=[rubric("R1", 1.0)], group_id="twins")


def test_off_asks_twins_in_a_group_too_and_group_asks_them_once(database_url: str, marker_judge: JudgeServer) -> None:
    with api_client(database_url, marker_judge.url, judge_reuse="off") as client:
        scored(client, twins())
        assert marker_judge.count("visit") == 2
    marker_judge.calls.clear()
    with api_client(database_url, marker_judge.url, judge_reuse="group") as client:
        doc = twins()
        doc["group_id"] = "twins-2"
        scored(client, doc)
        assert marker_judge.count("visit") == 1


def test_the_store_survives_a_restart_and_honours_its_age_limit(database_url: str, marker_judge: JudgeServer) -> None:
    with api_client(database_url, marker_judge.url) as client:
        scored(client, group("before"))
    asked = marker_judge.count()
    with api_client(database_url, marker_judge.url) as client:  # a new process
        assert scored(client, group("after"))["usage"]["reused"] == asked
    assert marker_judge.count() == asked
    with Database(database_url).session() as s:
        s.execute(update(m.JudgeAnswer).values(created_at=utcnow() - timedelta(hours=2)))
    with api_client(database_url, marker_judge.url, judge_reuse_max_age_s=3600) as client:
        assert scored(client, group("stale"))["usage"]["reused"] == 0
    assert marker_judge.count() == 2 * asked


def test_the_size_limit_drops_the_oldest_answers_first(database_url: str, marker_judge: JudgeServer) -> None:
    from drcredit.scoring.work.reuse import ReusePolicy, ReuseStore

    with api_client(database_url, marker_judge.url) as client:
        scored(client, group("g"))
    db = Database(database_url)
    with db.session() as s:
        rows = s.query(m.JudgeAnswer).order_by(m.JudgeAnswer.id).all()
        assert len(rows) == marker_judge.count()
        for age, row in enumerate(reversed(rows)):  # the first stored is made the oldest
            row.created_at = utcnow() - timedelta(minutes=age + 1)
        ids = [r.id for r in rows]
    store = ReuseStore(db, None, ReusePolicy("tenant", max_entries=2))  # type: ignore[arg-type]
    assert store.prune() == len(ids) - 2
    with db.session() as s:
        assert sorted(r.id for r in s.query(m.JudgeAnswer)) == ids[-2:]


@contextmanager
def store_warnings(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The reuse store's warnings, captured. The capture handler goes on the store's
    logger itself: the app's logging set-up replaces the root logger's handlers, where
    caplog's would otherwise be."""
    store_log = logging.getLogger("drcredit.reuse")
    store_log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="drcredit.reuse"):
            yield
    finally:
        store_log.removeHandler(caplog.handler)


def test_a_store_that_cannot_be_read_degrades_to_asking_the_judge(
    database_url: str, marker_judge: JudgeServer, caplog: pytest.LogCaptureFixture
) -> None:
    with api_client(database_url, marker_judge.url) as client:
        first = scored(client, group("ok"))
        asked = marker_judge.count()
        with Database(database_url).session() as s:
            s.execute(text("DROP TABLE judge_answers"))
        with store_warnings(caplog):
            doc = scored(client, group("broken"))
        assert doc["status"] == "done" and doc["usage"]["reused"] == 0
        assert advantages(doc) == advantages(first)
        assert all(j["status"] != "failed" for j in credits(client, "broken"))
        assert marker_judge.count() == 2 * asked
        assert any("could not be read" in r.getMessage() for r in caplog.records)


def test_a_failed_save_does_not_silence_the_news_that_the_store_cannot_be_read(
    database_url: str, marker_judge: JudgeServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A step's last saves can still be on their way when the store breaks: their failure
    # is logged first, and the next step's failed reads must be logged all the same.
    import asyncio

    from drcredit.domain.verdicts import ScoreVerdict
    from drcredit.judges.attempts import Attempt
    from drcredit.judges.results import JudgeResult
    from drcredit.scoring.work.reuse import ReusePolicy, ReuseStore

    with api_client(database_url, marker_judge.url) as client:
        scored(client, group("g"))
    db = Database(database_url)
    with db.session() as s:
        group_pk = s.query(m.Group.id).scalar()
        s.execute(text("DROP TABLE judge_answers"))

    async def run_db(fn: Any, *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def save_then_look_up() -> object:
        store = ReuseStore(db, run_db, ReusePolicy("tenant"))
        asked = Attempt(1, "ok", 0.1, endpoint="http://j/v1", model="m")
        answer = JudgeResult("score", "ok", "m", "openai", ScoreVerdict(3), {"score": 3}, attempts=[asked])
        await store.save(group_pk, "d1", answer)
        await store.flush()
        return await store.lookup(group_pk, "d2", "score", None)

    with store_warnings(caplog):
        assert asyncio.run(save_then_look_up()) is None
    messages = [r.getMessage() for r in caplog.records if r.name == "drcredit.reuse"]
    assert any("not kept for reuse" in msg for msg in messages), messages
    assert any("could not be read" in msg for msg in messages), messages


def test_bad_reuse_or_layout_settings_refuse_to_start() -> None:
    with pytest.raises(
        ValueError, match=r"DRCREDIT_JUDGE_REUSE: unknown value 'always' \(allowed: tenant, group, off\)"
    ):
        Settings(judge_reuse="always")
    with pytest.raises(
        ValueError, match=r"DRCREDIT_JUDGE_PROMPT_LAYOUT: unknown value 'x'.*shared-first-v1, rubric-first-v0"
    ):
        Settings(judge_prompt_layout="x")
    with pytest.raises(ValueError, match="judge_reuse_max_age_s"):
        Settings(judge_reuse_max_age_s=0)
    with pytest.raises(ValueError, match="judge_reuse_max_entries"):
        Settings(judge_reuse_max_entries=0)


def test_an_audit_never_reuses(database_url: str, marker_judge: JudgeServer) -> None:
    # The audit judge is the main judge itself (same endpoint, model and settings): its
    # requests are identical to the stored answers', and it must ask them all again.
    with api_client(database_url, marker_judge.url, audit_judges={"again": {}}) as client:
        doc = group("audited")
        doc["metadata"] = {"run": "exp", "step": 1}
        scored(client, doc)
        scored(client, {**doc, "group_id": "audited-2"})  # answered from the store
        asked = marker_judge.count()
        r = client.post("/v1/audits", json={"judge": "again", "scope": {"group_ids": ["audited"]}})
        assert r.status_code == 202, r.text
        report = client.get(f"/v1/audits/{r.json()['audit_id']}", params={"wait": 60}).json()
        assert report["status"] == "done"
        assert report["usage"]["calls"] == marker_judge.count() - asked == asked
