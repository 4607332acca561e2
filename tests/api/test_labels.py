"""Labels from people and audits against them, through the API (embedded mode, SQLite and
Postgres), over a judge server started here that answers from markers and fails one
judgment on purpose (rollout c, rubric R2), so that a failed original is in the set.

Every figure below is worked out by hand from the rules (docs/audit.md): the lower median
of several labels, exact agreement, the quadratic-weighted kappa, the bias and the
marginals, left-out keys, and the labelers compared with each other.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.api import api_client
from tests.support.builders import answer, group_doc, page, rollout, rubric, visit
from tests.support.judge_server import Call, JudgeServer, Reply, marker_answer, running_judge

T2 = {"Authorization": "Bearer kb"}


def failing_c_r2(call: Call) -> Reply:
    """The marker judge, except that the visit of rollout c is never answered for R2."""
    doc = call.document
    if call.kind == "visit" and doc["rubric_item"]["id"] == "R2" and "x.org/3" in doc["visit"]["pages"][0]["url"]:
        return Reply(content="not an answer")
    return Reply.json(marker_answer(call))


@pytest.fixture
def judge() -> Iterator[JudgeServer]:
    with running_judge(failing_c_r2) as server:
        yield server


@pytest.fixture
def client(database_url: str, judge: JudgeServer) -> Iterator[TestClient]:
    with api_client(database_url, judge.url, api_keys="t1:ka,t2:kb") as c:
        c.headers["Authorization"] = "Bearer ka"
        yield c


def three_rollouts(group_id: str = "g0") -> dict[str, Any]:
    """Visit levels by the judge: a-R1 2, a-R2 1, b-R1 1, b-R2 0, c-R1 2, c-R2 failed."""
    return group_doc(
        rollout("a", visit(page("W1", "https://x.org/1", "[R1:2:f1] [R2:1:f2]")), answer(), reward=0.9),
        rollout("b", visit(page("W1", "https://x.org/2", "[R1:1:f3]")), answer(), reward=0.1),
        rollout("c", visit(page("W1", "https://x.org/3", "[R1:2:f4]")), answer(), reward=0.5),
        rubrics=[rubric("R1"), rubric("R2")],
        group_id=group_id,
        metadata={"run": "exp", "step": 0},
    )


@pytest.fixture
def scored(client: TestClient) -> dict[str, Any]:
    doc = three_rollouts()
    assert client.post("/v1/groups", json=doc).status_code == 202
    r = client.get("/v1/groups/g0/advantages", params={"wait": 30})
    assert r.status_code == 200, r.text
    return doc


def key(rollout_id: str, rubric_id: str) -> dict[str, Any]:
    return {"rollout_id": rollout_id, "turn_index": 0, "rubric_id": rubric_id}


def label(client: TestClient, labeler: str, rollout_id: str, rubric_id: str, value: int) -> dict[str, Any]:
    body = {"group_id": "g0", "kind": "visit", "key": key(rollout_id, rubric_id), "value": value, "labeler": labeler}
    r = client.post("/v1/labels", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def queue(client: TestClient, labeler: str, **params: Any) -> dict[str, Any]:
    r = client.get("/v1/labels/queue", params={"run": "exp", "labeler": labeler, **params})
    assert r.status_code == 200, r.text
    return r.json()


def audit(client: TestClient, **body: Any) -> dict[str, Any]:
    r = client.post("/v1/audits", json={"judge": "human", "scope": {"run": "exp"}, **body})
    assert r.status_code == 202, r.text
    done = client.get(f"/v1/audits/{r.json()['audit_id']}")
    assert done.status_code == 200, done.text
    return done.json()


def test_the_queue_offers_what_the_judge_saw_never_its_answer_nor_failed_or_labeled_keys(
    client: TestClient, scored: dict[str, Any]
) -> None:
    first = queue(client, "ann", kind="visit", n=10, seed=3)
    # Six visit keys, c-R2 failed: five offered.
    assert first["available"] == 5 and len(first["items"]) == 5
    offered = {(i["key"]["rollout_id"], i["key"]["rubric_id"]) for i in first["items"]}
    assert offered == {("a", "R1"), ("a", "R2"), ("b", "R1"), ("b", "R2"), ("c", "R1")}
    item = next(i for i in first["items"] if i["key"] == key("a", "R2"))
    assert item["kind"] == "visit" and item["group_id"] == "g0"
    shown = item["shown"]
    assert shown["question"] == scored["question"]
    assert shown["rubric"]["id"] == "R2" and shown["rubric"]["description"] == "rubric R2"
    assert shown["support_already_credited"] == []
    assert shown["visit"]["pages"][0]["evidence"] == "[R1:2:f1] [R2:1:f2]"
    for i in first["items"]:
        flat = repr(i)
        for answer_field in ("level", "rationale", "support_points", "page_ids", "'value'", "judge"):
            assert answer_field not in flat, (answer_field, i)
    # The same seed draws the same sample; n bounds it.
    assert queue(client, "ann", kind="visit", n=10, seed=3) == first
    assert len(queue(client, "ann", kind="visit", n=2, seed=3)["items"]) == 2
    # Labeled keys leave that labeler's queue only; the label's answer reveals the judge's.
    given = client.post("/v1/labels", json={"item_id": item["item_id"], "value": 0, "labeler": "ann"})
    assert given.status_code == 201, given.text
    assert given.json()["judge"]["value"] == 1 and given.json()["key"] == key("a", "R2")
    after = queue(client, "ann", kind="visit", n=10)
    assert after["available"] == 4 and item["item_id"] not in {i["item_id"] for i in after["items"]}
    assert queue(client, "ben", kind="visit", n=10)["available"] == 5
    # No outcome judged, no search: those kinds offer nothing.
    assert queue(client, "ann", kind="snippet,report_rubric,citation")["items"] == []


def test_a_second_label_by_the_same_labeler_replaces_the_first_and_undo_takes_it_back(
    client: TestClient, scored: dict[str, Any]
) -> None:
    first = label(client, "ann", "a", "R1", 1)
    label(client, "ann", "a", "R1", 2)
    label(client, "ben", "a", "R1", 0)
    mine = client.get("/v1/labels", params={"group_id": "g0", "labeler": "ann"}).json()["labels"]
    assert [(x["key"], x["value"]) for x in mine] == [(key("a", "R1"), 2)]
    assert len(client.get("/v1/labels", params={"group_id": "g0"}).json()["labels"]) == 2
    r = client.delete(f"/v1/labels/{first['item_id']}", params={"labeler": "ann"})
    assert r.status_code == 204
    assert client.get("/v1/labels", params={"labeler": "ann"}).json()["labels"] == []
    assert client.delete(f"/v1/labels/{first['item_id']}", params={"labeler": "ann"}).status_code == 404


@pytest.mark.parametrize(
    ("body", "status", "field", "message"),
    [
        (
            {"kind": "visit", "key": key("a", "R1"), "value": 3},
            422,
            "value",
            "a visit label is a whole number 0..2, got 3",
        ),
        ({"kind": "visit", "key": key("a", "R1"), "value": -1}, 422, "value", "0..2"),
        ({"kind": "visit", "key": key("a", "R1"), "value": True}, 422, "value", "integer"),
        ({"kind": "snippet", "key": key("a", "R1"), "value": 1}, 422, "key", "has no snippet judgment"),
        ({"kind": "visit", "key": key("z", "R1"), "value": 1}, 422, "key", "has no visit judgment at rollout 'z'"),
        (
            {"kind": "visit", "key": {"rollout_id": "a", "rubric_id": "R1"}, "value": 1},
            422,
            "key.turn_index",
            "missing",
        ),
        ({"kind": "citation", "key": {"rollout_id": "a", "claim": 0}, "value": 2}, 422, "key", "no citation"),
        ({"kind": "verdict", "key": key("a", "R1"), "value": 1}, 422, "kind", "unknown kind 'verdict'"),
        ({"kind": "visit", "value": 1}, 422, "key", "missing"),
        (
            {"kind": "visit", "key": key("a", "R1"), "value": 1, "group_id": "nope"},
            404,
            "group_id",
            "group 'nope' not found",
        ),
    ],
)
def test_a_bad_label_is_refused_naming_the_field(
    client: TestClient, scored: dict[str, Any], body: dict[str, Any], status: int, field: str, message: str
) -> None:
    r = client.post("/v1/labels", json={"group_id": "g0", "labeler": "ann", **body})
    assert r.status_code == status, r.text
    detail = r.json()["detail"][0]
    assert detail["field"] == field and message in detail["message"], detail
    assert client.get("/v1/labels").json()["labels"] == []


def test_another_tenants_items_and_labels_are_unknown(client: TestClient, scored: dict[str, Any]) -> None:
    item = queue(client, "ann", n=1)["items"][0]
    r = client.post("/v1/labels", json={"item_id": item["item_id"], "value": 1, "labeler": "eve"}, headers=T2)
    assert r.status_code == 404 and r.json()["detail"][0]["field"] == "item_id"
    r = client.post(
        "/v1/labels",
        json={"group_id": "g0", "kind": "visit", "key": key("a", "R1"), "value": 1, "labeler": "eve"},
        headers=T2,
    )
    assert r.status_code == 404 and r.json()["detail"][0]["field"] == "group_id"
    assert client.get("/v1/labels/queue", params={"run": "exp", "labeler": "eve"}, headers=T2).status_code == 404
    label(client, "ann", "a", "R1", 1)
    assert client.get("/v1/labels", headers=T2).json()["labels"] == []
    assert client.delete(f"/v1/labels/{item['item_id']}", params={"labeler": "ann"}, headers=T2).status_code == 404
    r = client.post("/v1/labels", json={"item_id": "itm-garbage", "value": 1, "labeler": "ann"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "item_id"


def test_text_that_cannot_be_stored_is_refused_naming_the_field(client: TestClient) -> None:
    # A NUL cannot be stored in (nor looked up in) a Postgres text column: a 422 naming
    # the field, never a 500 from the database.
    def refused(r: Any, field: str) -> None:
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["field"].startswith(field), r.text
        assert "NUL" in r.text, r.text

    refused(client.get("/v1/labels", params={"group_id": "\x00"}), "query.group_id")
    refused(client.get("/v1/labels", params={"labeler": "a\x00"}), "query.labeler")
    for name in ("run", "batch_id", "group_ids", "kind"):
        refused(client.get("/v1/labels/queue", params={name: "x\x00", "labeler": "ann"}), f"query.{name}")
    refused(client.get("/v1/labels/queue", params={"run": "exp", "labeler": "\x00"}), "query.labeler")
    refused(client.delete("/v1/labels/itm-x", params={"labeler": "a\x00"}), "query.labeler")
    nul_item = "itm-" + base64.urlsafe_b64encode(json.dumps(["g\x00", "visit", "a", 0, "R1"]).encode()).decode()
    refused(client.delete(f"/v1/labels/{nul_item}", params={"labeler": "ann"}), "item_id")
    refused(client.post("/v1/labels", json={"item_id": nul_item, "value": 1, "labeler": "ann"}), "item_id")
    body = {"group_id": "g\x00", "kind": "visit", "key": key("a", "R1"), "value": 1, "labeler": "ann"}
    refused(client.post("/v1/labels", json=body), "group_id")


def test_an_import_with_one_bad_label_stores_nothing(client: TestClient, scored: dict[str, Any]) -> None:
    good = {"group_id": "g0", "kind": "visit", "key": key("a", "R1"), "value": 1, "labeler": "ann"}
    bad = {**good, "key": key("b", "R1"), "value": 5}
    r = client.post("/v1/labels/import", json={"labels": [good, bad, {**good, "labeler": "ben"}]})
    assert r.status_code == 422
    assert r.json()["detail"] == [
        {"field": "labels[1].value", "message": "a visit label is a whole number 0..2, got 5"}
    ]
    assert client.get("/v1/labels").json()["labels"] == []
    r = client.post("/v1/labels/import", json={"labels": [good, {**good, "labeler": "ben"}, {**good, "value": 2}]})
    assert r.status_code == 201 and r.json() == {"stored": 3, "replaced": 1}
    assert {(x["labeler"], x["value"]) for x in client.get("/v1/labels").json()["labels"]} == {("ann", 2), ("ben", 1)}


def test_an_audit_against_people_gives_the_figures_worked_by_hand(client: TestClient, scored: dict[str, Any]) -> None:
    # The judge's levels: a-R1 2, a-R2 1, b-R1 1, b-R2 0, c-R1 2, c-R2 failed.
    for labeler, rollout_id, rubric_id, value in [
        ("ann", "a", "R1", 1), ("ann", "a", "R2", 1), ("ann", "b", "R1", 1), ("ann", "b", "R2", 0),
        ("ann", "c", "R1", 2), ("ann", "c", "R2", 2),
        ("ben", "a", "R1", 2), ("ben", "a", "R2", 0), ("ben", "b", "R1", 1), ("ben", "c", "R1", 1),
        ("cat", "a", "R1", 0),
    ]:  # fmt: skip
        label(client, labeler, rollout_id, rubric_id, value)
    report = audit(client)
    assert report["status"] == "done" and report["judge"] == "human" and report["group_ids"] == ["g0"]
    # One value per key, the lower median v_ceil(k/2) of the sorted labels:
    # a-R1 (0, 1, 2): k = 3, v2 = 1; a-R2 (0, 1): k = 2, v1 = 0; b-R1 (1, 1): 1; b-R2 (0): 0;
    # c-R1 (1, 2): v1 = 1; c-R2: the judge failed, left out.
    # Pairs (judge, people): (2, 1), (1, 0), (1, 1), (0, 0), (2, 1).
    visit = report["agreement"]["visit"]
    assert visit["pairs"] == 5 and visit["left_out"] == 1
    assert visit["exact"] == pytest.approx(2 / 5)
    assert visit["confusion"] == [[1, 0, 0], [1, 1, 0], [0, 2, 0]]
    assert visit["bias"] == pytest.approx((-1 - 1 + 0 + 0 - 1) / 5)
    assert visit["marginals"]["original"] == pytest.approx([1 / 5, 2 / 5, 2 / 5])
    assert visit["marginals"]["audit"] == pytest.approx([2 / 5, 3 / 5, 0])
    # Shares O: (0,0) 1/5, (1,0) 1/5, (1,1) 1/5, (2,1) 2/5; w = (i - j)^2 / 4.
    # sum w O = 1/4 * 1/5 + 1/4 * 2/5 = 3/20. Rows (1/5, 2/5, 2/5), columns (2/5, 3/5, 0):
    # sum w E = 1/4 (1/5 * 3/5) + 1/4 (2/5 * 2/5) + 1 (2/5 * 2/5) + 1/4 (2/5 * 3/5) = 29/100.
    assert visit["kappa"] == pytest.approx(1 - (3 / 20) / (29 / 100))
    assert visit["first_visit"]["pairs"] == 5 and visit["first_visit"]["left_out"] == 1
    for kind in ("snippet", "report_rubric", "citation"):
        figures = report["agreement"][kind]
        assert figures["pairs"] == 0 and figures["bias"] is None and figures["marginals"] is None
        assert figures["kappa"] is None and figures["exact"] is None
    assert report["effect"] is None and report["usage"]["calls"] == 0 and report["usage"]["labels"] == 11
    # The labelers against each other, the first by name as the original.
    labelers = report["labelers"]
    assert labelers["labels"] == {"ann": 6, "ben": 4, "cat": 1}
    pairs = {(p["original"], p["audit"]): p["agreement"]["visit"] for p in labelers["pairs"]}
    assert list(pairs) == [("ann", "ben"), ("ann", "cat"), ("ben", "cat")]
    # ann vs ben on a-R1 (1, 2), a-R2 (1, 0), b-R1 (1, 1), c-R1 (2, 1).
    ab = pairs[("ann", "ben")]
    assert ab["pairs"] == 4 and ab["left_out"] == 0 and ab["exact"] == pytest.approx(1 / 4)
    assert ab["confusion"] == [[0, 0, 0], [1, 1, 1], [0, 1, 0]]
    assert ab["bias"] == pytest.approx((1 - 1 + 0 - 1) / 4)
    # O: (1,0) 1/4, (1,1) 1/4, (1,2) 1/4, (2,1) 1/4; sum w O = 3 * 1/4 * 1/4 = 3/16.
    # Rows (0, 3/4, 1/4), columns (1/4, 1/2, 1/4): sum w E = 1/4 (3/4 * 1/4) * 2 + 1 (1/4 * 1/4)
    # + 1/4 (1/4 * 1/2) = 3/32 + 1/16 + 1/32 = 6/32.
    assert ab["kappa"] == pytest.approx(1 - (3 / 16) / (6 / 32))
    assert ab["marginals"] == {
        "original": pytest.approx([0, 3 / 4, 1 / 4]),
        "audit": pytest.approx([1 / 4, 1 / 2, 1 / 4]),
    }
    # ann vs cat on a-R1 (1, 0) only; ben vs cat on a-R1 (2, 0): one pair, kappa 1 - 1 = 0.
    assert pairs[("ann", "cat")]["bias"] == -1 and pairs[("ann", "cat")]["kappa"] == pytest.approx(0)
    assert pairs[("ben", "cat")]["bias"] == -2 and pairs[("ben", "cat")]["exact"] == 0
    # One labeler alone, ann's values as they are: (2, 1), (1, 1), (1, 1), (0, 0), (2, 2).
    alone = audit(client, labelers=["ann"])["agreement"]["visit"]
    assert alone["pairs"] == 5 and alone["exact"] == pytest.approx(4 / 5) and alone["bias"] == pytest.approx(-1 / 5)
    assert audit(client, labelers=["ann"])["labelers"]["pairs"] == []


def test_a_human_audit_needs_labels_and_names_what_is_wrong(client: TestClient, scored: dict[str, Any]) -> None:
    r = client.post("/v1/audits", json={"judge": "human", "scope": {"run": "exp"}})
    assert r.status_code == 422 and r.json()["detail"][0] == {
        "field": "scope",
        "message": "no done group in this scope has a label",
    }
    label(client, "ann", "a", "R1", 1)
    r = client.post("/v1/audits", json={"judge": "human", "scope": {"run": "exp"}, "labelers": ["ann", "zed"]})
    assert r.status_code == 422
    assert r.json()["detail"] == [{"field": "labelers[1]", "message": "no label by 'zed' in this scope"}]
    r = client.post("/v1/audits", json={"judge": "same", "scope": {"run": "exp"}, "labelers": ["ann"]})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "labelers"
    listed = client.get("/v1/audits").json()["audits"]
    assert listed == []
    done = audit(client)
    listed = client.get("/v1/audits").json()["audits"]
    assert listed[0]["audit_id"] == done["audit_id"] and listed[0]["effect"] is None


def test_every_kind_is_offered_with_what_its_judge_saw_and_labeled(database_url: str) -> None:
    """The judged example (searches, visits, report rubrics, citations) under the offline
    judge: each kind's items show that kind's prompt material, and take that kind's values."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[2] / "examples" / "group_judged.json").read_text())
    with api_client(database_url, None) as c:
        assert c.post("/v1/groups", json=doc).status_code == 202
        assert c.get(f"/v1/groups/{doc['group_id']}/advantages", params={"wait": 60}).status_code == 200
        top = {"visit": 2, "snippet": 1, "report_rubric": 4, "citation": 2}
        for kind, fields in {
            "visit": {"question", "rubric", "support_already_credited", "visit"},
            "snippet": {"question", "rubric", "snippets"},
            "report_rubric": {"question", "rubric", "report"},
            "citation": {"claim", "pages"},
        }.items():
            r = c.get("/v1/labels/queue", params={"group_ids": doc["group_id"], "kind": kind, "labeler": "ann", "n": 3})
            assert r.status_code == 200, r.text
            items = r.json()["items"]
            assert items and all(i["kind"] == kind and set(i["shown"]) == fields for i in items), (kind, items)
            too_high = c.post(
                "/v1/labels", json={"item_id": items[0]["item_id"], "value": top[kind] + 1, "labeler": "ann"}
            )
            assert too_high.status_code == 422 and too_high.json()["detail"][0]["field"] == "value"
            given = c.post("/v1/labels", json={"item_id": items[0]["item_id"], "value": top[kind], "labeler": "ann"})
            assert given.status_code == 201 and given.json()["judge"]["status"] == "ok"
        report = c.post("/v1/audits", json={"judge": "human", "scope": {"group_ids": [doc["group_id"]]}}).json()
        document = c.get(f"/v1/audits/{report['audit_id']}").json()
        assert all(document["agreement"][kind]["pairs"] == 1 for kind in top)
