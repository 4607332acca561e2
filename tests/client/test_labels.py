"""People's labels through the SDK, sync and async, against the real service (SQLite file,
the marker judge): the queue, a label and the judge's answer after it, an import that
stores all or nothing, the listing, undo, and an audit against the labels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from drcredit.client import InvalidRequest, NotFound
from tests.api.test_labels import three_rollouts
from tests.client.conftest import Connect, running_service
from tests.support.judge_server import JudgeServer


@pytest.fixture
def labeled_service(tmp_path: Path, marker_judge: JudgeServer) -> Iterator[str]:
    """One done group g0 of run ``exp``: visit levels a-R1 2, a-R2 1, b-R1 1, b-R2 0, c-R1 2, c-R2 0."""
    with running_service(tmp_path, marker_judge.url, api_keys="t1:k1,t2:k2") as url:
        with httpx.Client(base_url=url, headers={"Authorization": "Bearer k1"}, timeout=60) as c:
            assert c.post("/v1/groups", json=three_rollouts()).status_code == 202
            assert c.get("/v1/groups/g0/advantages", params={"wait": 60}).status_code == 200
        yield url


def test_labels_given_imported_listed_taken_back_and_audited(labeled_service: str, connect: Connect) -> None:
    client = connect(labeled_service, api_key="k1")
    queue = client.label_queue("ann", run="exp", kind="visit", n=6, seed=1)
    assert queue["available"] == 6 and len(queue["items"]) == 6
    assert queue == client.label_queue("ann", group_ids=["g0"], kind=["visit"], n=6, seed=1)
    first = queue["items"][0]
    given = client.post_label(0, "ann", item_id=first["item_id"])
    assert given["value"] == 0 and given["judge"]["status"] == "ok" and given["key"] == first["key"]
    # All or nothing: the second label's value is off the scale.
    key = {"rollout_id": "a", "turn_index": 0, "rubric_id": "R1"}
    with pytest.raises(InvalidRequest) as refused:
        client.import_labels(
            [
                {"group_id": "g0", "kind": "visit", "key": key, "value": 2, "labeler": "ben"},
                {"group_id": "g0", "kind": "visit", "key": key, "value": 3, "labeler": "cat"},
            ]
        )
    assert [e["field"] for e in refused.value.errors] == ["labels[1].value"]
    assert [x["labeler"] for x in client.list_labels()] == ["ann"]
    stored = client.import_labels([{"group_id": "g0", "kind": "visit", "key": key, "value": 2, "labeler": "ben"}])
    assert stored == {"stored": 1, "replaced": 0}
    assert [x["labeler"] for x in client.list_labels(group_ids=["g0"], labeler="ben")] == ["ben"]
    # The judge against the labels of both: a-R1 2 against ben's 2, and ann's first item.
    report = client.start_audit("human", run="exp")
    assert report["status"] == "done"
    doc = client.get_audit(report["audit_id"])
    assert doc["effect"] is None and doc["labelers"]["labels"] == {"ann": 1, "ben": 1}
    only_ben = client.get_audit(client.start_audit("human", group_ids=["g0"], labelers=["ben"])["audit_id"])
    assert only_ben["agreement"]["visit"]["pairs"] == 1 and only_ben["agreement"]["visit"]["exact"] == 1.0
    client.delete_label(first["item_id"], "ann")
    assert client.list_labels(labeler="ann") == []
    with pytest.raises(NotFound):
        client.delete_label(first["item_id"], "ann")
    # Another tenant has none of it.
    other = connect(labeled_service, api_key="k2")
    assert other.list_labels() == []
    with pytest.raises(NotFound):
        other.post_label(1, "eve", item_id=first["item_id"])
