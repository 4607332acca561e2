"""A done group's advantages document is stored with its results and served as stored.

The stored document must be the one a read of the rows builds (the reference,
``documents.advantages_documents``), and a group finished before documents were stored
(revision 0007) must get the same answer from its rows. On SQLite and on Postgres.
"""

from __future__ import annotations

from typing import Any

import orjson
from sqlalchemy import update

from drcredit.scoring.results import documents
from drcredit.storage import models as m
from drcredit_api.auth import OPEN_TENANT
from tests.support.api import api_client
from tests.support.judge_server import JudgeServer, Reply, running_judge
from tests.support.scenarios import hand_worked_group


def stored_and_rebuilt(client: Any, group_ids: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    db = client.app.state.runtime.db
    with db.read_session() as s:
        rows = documents.final_states(s, OPEN_TENANT, group_ids)
        stored = {r.group_id: orjson.loads(r.advantages_json) for r in rows if r.advantages_json is not None}
        rebuilt = documents.advantages_documents(s, OPEN_TENANT, group_ids)
    return stored, rebuilt


def forget_stored_documents(client: Any) -> None:
    with client.app.state.runtime.db.session() as s:
        s.execute(update(m.Group).values(advantages_json=None))


def test_the_stored_document_is_the_one_the_rows_give_and_is_what_is_served(
    database_url: str, marker_judge: JudgeServer
) -> None:
    groups = [hand_worked_group(group_id="q1", metadata={"run": "r", "step": 3}), hand_worked_group(group_id="q2")]
    groups[1]["params"] = {"cap": 0.5}
    with api_client(database_url, marker_judge.url) as client:
        assert client.post("/v1/batches", json={"batch_id": "step-1", "groups": groups}).status_code == 202
        batch = client.get("/v1/batches/step-1/advantages", params={"wait": 30})
        assert batch.status_code == 200 and batch.headers["content-type"] == "application/json"
        single = client.get("/v1/groups/q2/advantages").json()
        stored, rebuilt = stored_and_rebuilt(client, ["q1", "q2"])
        assert set(stored) == {"q1", "q2"}
        assert stored == rebuilt
        assert batch.json() == {"batch_id": "step-1", "status": "done", "groups": [rebuilt["q1"], rebuilt["q2"]]}
        assert single == rebuilt["q2"] and single["params"]["cap"] == 0.5
        assert rebuilt["q1"]["metadata"] == {"run": "r", "step": 3}

        # As a group finished before revision 0007: no stored document, the same answers.
        forget_stored_documents(client)
        assert stored_and_rebuilt(client, ["q1", "q2"])[0] == {}
        assert client.get("/v1/batches/step-1/advantages").json() == batch.json()
        assert client.get("/v1/groups/q2/advantages").json() == single


def test_a_failed_group_has_no_document_and_its_batch_shows_why(database_url: str) -> None:
    zero = hand_worked_group(group_id="kept", params={"on_judge_failure": "zero"})
    fail = hand_worked_group(group_id="lost", params={"on_judge_failure": "fail"})
    with running_judge(lambda call: Reply(content="no idea")) as broken, api_client(database_url, broken.url) as c:
        assert c.post("/v1/batches", json={"batch_id": "b", "groups": [zero, fail]}).status_code == 202
        r = c.get("/v1/batches/b/advantages", params={"wait": 30})
        assert r.status_code == 200
        body = r.json()
        assert body["status"] == "failed" and [g["group_id"] for g in body["groups"]] == ["kept", "lost"]
        stored, rebuilt = stored_and_rebuilt(c, ["kept"])
        assert body["groups"][0] == stored["kept"] == rebuilt["kept"]
        assert body["groups"][0]["progress"]["judgments_failed"] == 8
        lost = body["groups"][1]
        assert (
            lost["status"] == "failed"
            and "judgment failed" in lost["error"]
            and set(lost)
            == {
                "group_id",
                "status",
                "error",
                "usage",
            }
        )
        # The failed group's judge work was spent all the same: each judgment stored
        # failed after its 2 attempts, each answered 'no idea' (7 characters: 1 token).
        usage = lost["usage"]
        assert usage["judgments"] >= 1 and usage["calls"] == 2 * usage["judgments"]
        assert usage["completion_tokens"] == usage["calls"] and usage["cost_usd"] is None
        with c.app.state.runtime.db.read_session() as s:
            assert [r.advantages_json for r in documents.final_states(s, OPEN_TENANT, ["lost"])] == [None]
        answer = c.get("/v1/groups/lost/advantages")
        assert answer.status_code == 409 and answer.json()["status"] == "failed"


def test_a_long_poll_that_runs_out_says_what_is_not_final(database_url: str, marker_judge: JudgeServer) -> None:
    open_group = hand_worked_group(group_id="open", expected_rollouts=3)
    with api_client(database_url, marker_judge.url) as client:
        assert client.post("/v1/batches", json={"batch_id": "b", "groups": [open_group]}).status_code == 202
        r = client.get("/v1/batches/b/advantages", params={"wait": 0.3})
        assert r.status_code == 409 and r.json()["status"] in ("queued", "running")
        assert "1 of 1 groups not finished" in r.json()["message"]
        r = client.get("/v1/groups/open/advantages", params={"wait": 0.3})
        assert r.status_code == 409 and r.json()["status"] in ("queued", "running")
        assert client.get("/v1/groups/nope/advantages", params={"wait": 0.3}).status_code == 404
        assert client.get("/v1/batches/nope/advantages", params={"wait": 0.3}).status_code == 404
