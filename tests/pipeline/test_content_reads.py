"""A delivery's rollouts are read with its claim, together, not one database turn each."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from prometheus_client import REGISTRY

from drcredit.scoring.work.rollout_cache import RolloutCache
from drcredit.storage import repository as repo
from drcredit.wiring.runtime import Runtime
from tests.pipeline.test_pipeline import REPEAT, levels, runtime, score
from tests.support.api import settings_for
from tests.support.builders import answer, group, page, rollout, search, visit
from tests.support.judge_server import JudgeServer

TWO_KINDS = group(
    rollout(
        "a",
        search(("S1", "https://x.org/1", "[R1:1:fact-1]"), ("S2", "https://y.org/2", "[R1:2:fact-2]")),
        visit(page("W1", "https://x.org/1", "[R1:2:fact-1]")),
        answer(),
        reward=1.0,
    ),
    rollout("b", visit(page("W2", "https://z.org/3", "[R1:1:fact-3]")), answer(), reward=0.0),
)


def test_units_find_their_rollouts_read_with_their_claim(
    tmp_path: Path, marker_judge: JudgeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the one-rollout read out of order, a group of visit chains and snippet calls
    still scores exactly: every unit found its content cached by its delivery's claim."""

    def one_by_one(*args: object) -> None:
        raise AssertionError("a rollout was read on its own")

    with runtime(tmp_path, marker_judge) as rt:
        expected = score(rt, REPEAT)
    monkeypatch.setattr(repo, "rollout_document", one_by_one)
    with runtime(tmp_path / "again", marker_judge) as rt:
        doc = score(rt, REPEAT)
        assert levels(doc, "a") == levels(expected, "a") and levels(doc, "b") == levels(expected, "b")
        both = score(rt, TWO_KINDS.model_copy(update={"group_id": "two-kinds"}))
    kinds = {j["kind"] for r in both["credits"]["rollouts"] for t in r["turns"] for j in t["judgments"]}
    assert kinds == {"visit", "snippet"}


def test_rollouts_read_together_are_those_read_one_by_one(database_url: str, marker_judge: JudgeServer) -> None:
    rt = Runtime.build(settings_for(database_url, marker_judge.url))
    try:
        sub = rt.pipeline.submit_group("t", TWO_KINDS.model_copy(update={"group_id": "together"}))
        with rt.db.read_session() as s:
            together = repo.rollout_documents(s, sub.group_pk, {"a", "b", "missing"})
            alone = {r: repo.rollout_document(s, sub.group_pk, r) for r in ("a", "b")}
            assert repo.rollout_documents(s, sub.group_pk, set()) == {}
    finally:
        rt.close()
    assert together == alone
    assert [len(together[r]["rollouts"][0]["turns"]) for r in ("a", "b")] == [3, 2]


def test_a_failed_read_ahead_leaves_each_unit_to_read_its_own_rollout(
    tmp_path: Path, marker_judge: JudgeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(*args: object) -> None:
        raise RuntimeError("database went away for a moment")

    with runtime(tmp_path, marker_judge) as rt:
        expected = score(rt, REPEAT)
    monkeypatch.setattr(repo, "rollout_documents", unavailable)
    with runtime(tmp_path / "again", marker_judge) as rt:
        doc = score(rt, REPEAT)
    assert doc["advantages"]["rollouts"] == expected["advantages"]["rollouts"]


def test_rollout_content_kept_is_bounded_by_its_stored_size(database_url: str, marker_judge: JudgeServer) -> None:
    """The content cache is bounded by the stored JSON size of what it keeps; an evicted
    rollout is read again, the same."""
    rt = Runtime.build(settings_for(database_url, marker_judge.url, rollout_cache_mb=3))
    try:
        assert rt.pipeline.rollouts.content_budget == 3 << 20  # DRCREDIT_ROLLOUT_CACHE_MB
        sub = rt.pipeline.submit_group("t", TWO_KINDS.model_copy(update={"group_id": "bounded"}))
        with rt.db.read_session() as s:
            size = {r: len(orjson.dumps(repo.rollout_document(s, sub.group_pk, r))) for r in ("a", "b")}
        cache = RolloutCache(rt.db, rt.pipeline.engine, content_budget=size["a"] + size["b"] - 1)
        first = cache.content(sub.group_pk, "a")
        cache.content(sub.group_pk, "b")  # a and b together are one byte over: a goes
        assert cache.content_bytes == size["b"]
        again = cache.content(sub.group_pk, "a")
        assert again is not first and again == first
        assert cache.content_bytes == size["a"]
        cache.preload([(sub.group_pk, "a"), (sub.group_pk, "b")])  # read together, bounded the same
        assert cache.content_bytes in (size["a"], size["b"])
    finally:
        rt.close()


def test_a_group_scores_the_same_when_no_rollout_content_stays_cached(
    tmp_path: Path, marker_judge: JudgeServer
) -> None:
    with runtime(tmp_path, marker_judge) as rt:
        expected = score(rt, REPEAT)
    with runtime(tmp_path / "again", marker_judge) as rt:
        rt.pipeline.rollouts.content_budget = 1  # every read evicts the one before
        doc = score(rt, REPEAT)
        kept = rt.pipeline.rollouts.content_bytes
        assert kept > 1  # the newest entry is kept
        assert REGISTRY.get_sample_value("drcredit_rollout_cache_bytes") == kept
    assert doc["advantages"]["rollouts"] == expected["advantages"]["rollouts"]
    assert levels(doc, "a") == levels(expected, "a")
