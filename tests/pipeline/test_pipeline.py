"""The scoring pipeline in embedded mode: history, scheduling, call economy, restarts.

The judge is the real ``openai`` backend talking HTTP to a scripted server.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from drcredit.domain.group import GroupIn
from drcredit.scoring.dispatch import InProcessDispatcher, UnitRef
from drcredit.scoring.results import breakdown, documents
from drcredit.storage import models as m
from drcredit.storage.bulk import JudgmentRow, store_judgments
from drcredit.wiring.runtime import Runtime
from tests.support.api import settings_for
from tests.support.builders import answer, group, page, rollout, rubric, search, visit
from tests.support.judge_server import Call, JudgeServer, Reply, marker_answer, running_judge


@contextmanager
def runtime(tmp_path: Path, judge: JudgeServer, **overrides: Any) -> Iterator[Runtime]:
    rt = Runtime.build(settings_for(f"sqlite:///{tmp_path / 'db.sqlite3'}", judge.url, **overrides))
    try:
        yield rt
    finally:
        rt.close()


def score(rt: Runtime, g: GroupIn, timeout: float = 30) -> dict[str, Any]:
    sub = rt.pipeline.submit_group("t", g)
    assert isinstance(rt.dispatcher, InProcessDispatcher)
    deadline = time.monotonic() + timeout
    while True:
        rt.dispatcher.wait_idle(timeout=0.5)
        with rt.db.session() as s:
            row = documents.find_group(s, "t", sub.group_id, full=True)
            if row.status in ("done", "failed"):
                assert row.status == "done", row.error
                return {
                    "advantages": documents.advantages_document(s, row),
                    "credits": breakdown.credits_document(s, row),
                    "progress": documents.progress(s, row),
                }
        assert time.monotonic() < deadline, "group did not finish"


def levels(doc: dict[str, Any], rollout_id: str) -> list[dict[str, int]]:
    ro = next(r for r in doc["credits"]["rollouts"] if r["id"] == rollout_id)
    return [{j["rubric_id"]: j["level"] for j in t["judgments"] if j["kind"] == "visit"} for t in ro["turns"]]


REPEAT = group(
    rollout(
        "a",
        visit(page("W1", "https://x.org/1", "[R1:2:fact-1]")),
        visit(page("W2", "https://y.org/2", "same [R1:2:fact-1]")),
        visit(page("W3", "https://z.org/3", "[R1:1:fact-2] and [R1:2:fact-1]")),
        answer(),
        reward=1.0,
    ),
    rollout("b", visit(page("W1", "https://y.org/2", "same [R1:2:fact-1]")), answer(), reward=0.0),
)


def test_history_makes_repeated_support_worth_nothing(tmp_path: Path, marker_judge: JudgeServer) -> None:
    """a: fact-1 at t0 (level 2), again at t1 (0: already in history), t2 adds fact-2 (1).
    b has its own empty history, so the same page is level 2 there."""
    with runtime(tmp_path, marker_judge) as rt:
        doc = score(rt, REPEAT)
    assert levels(doc, "a")[:3] == [{"R1": 2}, {"R1": 0}, {"R1": 1}]
    assert levels(doc, "b")[0] == {"R1": 2}
    history = doc["credits"]["rollouts"][0]["support_histories"]["R1"]
    assert [(h["turn_index"], h["text"]) for h in history] == [(0, "fact-1"), (2, "fact-2")]
    # The judge saw a's history as it stood before each visit: the t1 and t2 calls
    # (the only calls with pages W2 and W3) carry fact-1 and nothing else.
    later = [c.document for c in marker_judge.calls if c.document["visit"]["pages"][0]["id"] in ("W2", "W3")]
    assert [d["support_already_credited"] for d in later] == [["fact-1"], ["fact-1"]]


def test_without_history_the_judge_sees_no_prior_support(tmp_path: Path, marker_judge: JudgeServer) -> None:
    g = REPEAT.model_copy(update={"params": REPEAT.params.model_copy(update={"history": False})})
    with runtime(tmp_path, marker_judge) as rt:
        doc = score(rt, g)
    assert levels(doc, "a")[:3] == [{"R1": 2}, {"R1": 2}, {"R1": 2}]
    assert all(c.document["support_already_credited"] == [] for c in marker_judge.calls if c.kind == "visit")


def test_deterministic_zeros_and_penalty_rubrics_make_no_call(tmp_path: Path, marker_judge: JudgeServer) -> None:
    g = group(
        rollout(
            "a",
            visit(page("W1", "https://x.org", "", error="404")),
            visit(page("W2", "https://y.org", "  ")),
            visit(page("W3", "https://z.org", "[R1:1:p]")),
            reward=1.0,
        ),
        rollout("b", answer(), reward=0.0),
        rubrics=[rubric("R1"), rubric("PEN", weight=-2.0)],
    )
    with runtime(tmp_path, marker_judge) as rt:
        doc = score(rt, g)
    assert marker_judge.count() == 1
    assert doc["progress"]["deterministic_zeros"] == 2 and doc["progress"]["judge_calls"] == 1
    assert [t["credit"] for t in doc["advantages"]["rollouts"][0]["turns"]] == [0.0, 0.0, 0.2]


def saturating_group(**params: Any) -> GroupIn:
    # The visit of S1's URL earns 1.0 (levels 2 + 2), saturating the search: its unvisited
    # S2 snippet needs no judge call unless skipping is switched off.
    return group(
        rollout(
            "a",
            search(("S1", "https://x.org/1"), ("S2", "https://n.org/1", "[R1] fact")),
            visit(page("W1", "https://x.org/1", "[R1:2:a] [R2:2:b]")),
            reward=1.0,
        ),
        rollout("b", search(("S1", "https://n.org/2", "[R2] other")), reward=0.0),
        rubrics=[rubric("R1"), rubric("R2")],
        params=params or None,
    )


def test_saturated_snippet_calls_are_skipped(tmp_path: Path, marker_judge: JudgeServer) -> None:
    with runtime(tmp_path, marker_judge) as rt:
        doc = score(rt, saturating_group())
    assert marker_judge.count("snippet") == 1  # only b's search
    assert doc["progress"]["snippet_calls_skipped"] == 1
    assert [t["credit"] for t in doc["advantages"]["rollouts"][0]["turns"]] == [1.0, 1.0]


def test_snippet_call_waits_only_while_saturation_is_undecided(tmp_path: Path, marker_judge: JudgeServer) -> None:
    with runtime(tmp_path, marker_judge) as rt:
        doc = score(rt, saturating_group(skip_saturated_snippets=False))
    assert marker_judge.count("snippet") == 2
    search_turn = doc["credits"]["rollouts"][0]["turns"][0]
    assert search_turn["snippet_matches"] == 1 and search_turn["credit"] == 1.0


def test_identical_requests_in_a_group_are_made_once(tmp_path: Path, marker_judge: JudgeServer) -> None:
    """Two rollouts whose first visit is identical (same turn, pages, empty history) share
    one judgment per rubric; the second is stored as a cache hit."""
    first = visit(page("W1", "https://x.org/1", "[R1:2:a]"))
    g = group(
        rollout("a", first, answer(), reward=1.0),
        rollout("b", first, answer(), reward=0.0),
        rollout("c", first, visit(page("W2", "https://y.org", "[R1:1:c]")), reward=0.5),
    )
    with runtime(tmp_path, marker_judge) as rt:
        doc = score(rt, g)
    assert marker_judge.count("visit") == 2  # one shared first visit + c's second visit
    assert doc["progress"]["cache_hits"] == 2 and doc["progress"]["judge_calls"] == 2
    assert [levels(doc, r)[0] for r in "abc"] == [{"R1": 2}] * 3


def test_an_identical_visit_at_another_position_is_the_same_request(tmp_path: Path, marker_judge: JudgeServer) -> None:
    """The judge is not told where a turn sits (docs/method.md lists no position among its inputs),
    so the same visit with the same (empty) history is one request wherever it occurs."""
    same = visit(page("W1", "https://x.org/1", "[R1:2:a]"))
    g = group(
        rollout("a", same, answer(), reward=1.0),
        rollout("b", search(("S1", "https://n.org/1")), same, answer(), reward=0.0),
    )
    with runtime(tmp_path, marker_judge) as rt:
        doc = score(rt, g)
    assert marker_judge.count("visit") == 1
    assert levels(doc, "a")[0] == {"R1": 2} and levels(doc, "b")[1] == {"R1": 2}


def test_chains_run_concurrently_up_to_the_limit(tmp_path: Path) -> None:
    def script(call: Call) -> Reply:
        return Reply.json(marker_answer(call), delay=0.2)

    g = group(
        *[
            rollout(
                f"r{i}",
                visit(page("W1", f"https://x.org/{i}", f"[R1:2:p{i}]")),
                visit(page("W2", f"https://y.org/{i}", f"[R1:1:q{i}]")),
                reward=float(i),
            )
            for i in range(8)
        ]
    )
    with running_judge(script) as server, runtime(tmp_path, server, judge_concurrency=4) as rt:
        score(rt, g)
    assert 2 <= server.peak_in_flight <= 4
    order: dict[str, list[int]] = {}
    for c in server.calls:
        # Each rollout's pages are W1 then W2: a chain judges them in that order.
        order.setdefault(c.document["visit"]["pages"][0]["url"].split("/")[-1], []).append(
            int(c.document["visit"]["pages"][0]["id"][1:])
        )
    assert all(v == sorted(v) for v in order.values())


def deep_and_short(group_id: str) -> GroupIn:
    """Rollout "a" with a 4-visit chain and "b" with a 1-visit chain: three calls shorter."""
    return group(
        rollout(
            "a",
            *[visit(page(f"A{k}", f"https://a.org/{k}", f"[R1:1:a{k}]")) for k in range(4)],
            reward=1.0,
        ),
        rollout("b", visit(page("B0", "https://b.org/0", "[R1:2:b0]")), reward=0.0),
        group_id=group_id,
    )


def first_calls(server: JudgeServer) -> tuple[float, float]:
    """When the judge received a's first visit call and b's call."""
    first_a = min(c.received_at for c in server.calls if c.document["visit"]["pages"][0]["id"] == "A0")
    b_call = next(c.received_at for c in server.calls if c.document["visit"]["pages"][0]["id"] == "B0")
    return first_a, b_call


def assert_deep_and_short_judged(doc: dict[str, Any]) -> None:
    """Both chains judged as without any hold."""
    assert levels(doc, "a")[:4] == [{"R1": 1}] * 4
    assert levels(doc, "b")[0] == {"R1": 2}


def test_a_short_chain_waits_one_judge_latency_behind_a_chain_three_calls_longer(tmp_path: Path) -> None:
    """The engine learns the judge's latency from answered calls (the first group);
    in the second group the 1-call chain of "b", three calls shorter than the 4-call
    chain of "a", makes its call about one latency after a's first call, and both are
    judged as without the hold."""

    def script(call: Call) -> Reply:
        return Reply.json(marker_answer(call), delay=0.3)

    warm = group(
        rollout("w", visit(page("W1", "https://w.org/1", "[R1:2:w]")), reward=1.0),
        rollout("x", answer(), reward=0.0),
        group_id="warm",
    )
    g = deep_and_short("held")
    with running_judge(script) as server, runtime(tmp_path, server) as rt:
        score(rt, warm)
        latency = rt.pipeline.engine.start_order.latency_s
        assert latency is not None and 0.3 <= latency < 1.0, latency
        doc = score(rt, g)
    first_a, b_call = first_calls(server)
    assert b_call - first_a >= 0.9 * latency, (b_call - first_a, latency)
    assert_deep_and_short_judged(doc)


def test_in_a_fresh_process_a_short_chain_waits_for_the_first_judge_call_to_end(tmp_path: Path) -> None:
    """No latency is known yet: the 1-call chain of "b" waits for the first call here to
    end (a's first, answered after 0.3 s), not for a timer, and both are judged as
    without the hold."""

    def script(call: Call) -> Reply:
        return Reply.json(marker_answer(call), delay=0.3)

    g = deep_and_short("cold")
    with running_judge(script) as server, runtime(tmp_path, server) as rt:
        assert rt.pipeline.engine.start_order.latency_s is None
        doc = score(rt, g)
    first_a, b_call = first_calls(server)
    assert 0.27 <= b_call - first_a < 3.0, b_call - first_a
    assert_deep_and_short_judged(doc)


def test_a_failed_call_teaches_the_engine_no_latency(tmp_path: Path) -> None:
    """Only answered calls pace the hold: a judge that only fails leaves it unknown."""

    def script(call: Call) -> Reply:
        return Reply(status=400, error="no")

    g = group(
        rollout("a", visit(page("A0", "https://a.org/0", "[R1:1:a0]")), reward=1.0),
        rollout("b", answer(), reward=0.0),
        params={"on_judge_failure": "zero"},
    )
    with running_judge(script) as server, runtime(tmp_path, server) as rt:
        score(rt, g)
        assert server.calls
        assert rt.pipeline.engine.start_order.latency_s is None


def test_restart_resumes_without_repeating_answered_calls(tmp_path: Path) -> None:
    def slow(call: Call) -> Reply:
        return Reply.json(marker_answer(call), delay=0.15)

    g = group(
        *[
            rollout(
                f"r{i}",
                *[visit(page(f"W{k}", f"https://x.org/{i}/{k}", f"[R1:1:p{k}]")) for k in range(4)],
                reward=float(i),
            )
            for i in range(3)
        ]
    )
    with running_judge(slow) as server:
        with runtime(tmp_path, server, judge_concurrency=2) as rt:
            sub = rt.pipeline.submit_group("t", g)
            time.sleep(0.5)
        # Closed mid-way: the rest resumes when the next process starts on the same database.
        with runtime(tmp_path, server, judge_concurrency=2) as rt:
            deadline = time.monotonic() + 30
            while True:
                with rt.db.session() as s:
                    row = documents.find_group(s, "t", sub.group_id, full=True)
                    if row.status == "done":
                        break
                assert time.monotonic() < deadline
                time.sleep(0.1)
        keys = Counter(
            (
                c.document["visit"]["pages"][0]["url"],
                tuple(c.document["support_already_credited"]),
            )
            for c in server.calls
        )
        assert max(keys.values()) == 1 and len(keys) == 12


class _Holding:
    """A dispatcher that leaves work queued in the database, as a stopped process does."""

    def dispatch(self, units: Any) -> None:
        pass

    def dispatch_aggregation(self, group_pk: int) -> None:
        pass


def _finished(rt: Runtime, group_id: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        with rt.db.session() as s:
            row = documents.find_group(s, "t", group_id, full=True)
            if row.status == "done":
                return {
                    "advantages": documents.advantages_document(s, row),
                    "credits": breakdown.credits_document(s, row),
                }
        assert time.monotonic() < deadline, "group did not finish"
        time.sleep(0.05)


def _judged(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (r["id"], t["index"], j["kind"], j.get("rubric_id"), j.get("level"), j.get("match_count"), j["status"])
        for r in doc["credits"]["rollouts"]
        for t in r["turns"]
        for j in t["judgments"]
    ]


def test_a_group_stored_before_outlines_and_snippet_payloads_scores_the_same(
    tmp_path: Path, marker_judge: JudgeServer
) -> None:
    """Rows from before migration 0002 have no outline and no snippet payload: units then
    read the rollout and aggregation its turn bodies, with the same requests and results."""
    g = group(
        rollout(
            "a",
            search(("S1", "https://x.org/1"), ("S2", "https://n.org/1", "[R1] a fact")),
            visit(page("W1", "https://x.org/1", "[R1:1:a]")),
            answer(),
            reward=1.0,
        ),
        rollout(
            "b",
            search(("S1", "https://n.org/2", "[R2] other fact"), ("S2", "https://y.org/2")),
            visit(page("W1", "https://y.org/2", "[R2:2:b]")),
            search(("S3", "https://n.org/3", "[R1] third")),
            reward=0.0,
        ),
        rubrics=[rubric("R1"), rubric("R2")],
    )
    (tmp_path / "new").mkdir()
    with runtime(tmp_path / "new", marker_judge) as rt:
        reference = score(rt, g)
    reference_requests = sorted(json.dumps(c.document, sort_keys=True) for c in marker_judge.calls)
    marker_judge.calls.clear()

    (tmp_path / "old").mkdir()
    url = f"sqlite:///{tmp_path / 'old' / 'db.sqlite3'}"
    held = Runtime.build(settings_for(url, marker_judge.url), dispatcher=_Holding())
    try:
        stored = held.pipeline.submit_group("t", g)
        with held.db.session() as s:
            s.execute(update(m.Rollout).values(outline=None))
            s.execute(update(m.WorkUnit).values(payload=None))
    finally:
        held.close()
    with runtime(tmp_path / "old", marker_judge) as rt:  # resumes the stored units
        legacy = _finished(rt, stored.group_id)
    assert marker_judge.count("snippet") >= 2  # snippet calls were made the old way
    assert sorted(json.dumps(c.document, sort_keys=True) for c in marker_judge.calls) == reference_requests
    assert legacy["advantages"]["rollouts"] == reference["advantages"]["rollouts"]
    assert _judged(legacy) == _judged(reference)


def test_a_claim_won_after_the_owner_answered_takes_its_answer(database_url: str, tmp_path: Path) -> None:
    """An identical request's owner stores its answer, then drops its claim: a waiter
    whose next try wins the claim must reuse that answer, not call the judge again."""
    rt = Runtime.build(settings_for(database_url, "http://127.0.0.1:9/v1"), dispatcher=_Holding())
    try:
        stored = rt.pipeline.submit_group("t", saturating_group())
        answer = {"level": 2, "page_ids": ["W1"], "support_points": ["a"], "rationale": "r"}
        with rt.db.session() as s:
            store_judgments(
                s,
                [
                    JudgmentRow(
                        {
                            "group_pk": stored.group_pk,
                            "kind": "visit",
                            "rollout_id": "a",
                            "turn_index": 1,
                            "rubric_id": "R1",
                            "status": "ok",
                            "level": 2,
                            "page_ids": ["W1"],
                            "support_points": ["a"],
                            "answer": answer,
                            "request_key": "k1",
                            "cache_hit": False,
                            "attempt_count": 1,
                            "attempts": [],
                            "created_at": datetime.now(UTC),
                        }
                    )
                ],
            )
        token, hit = rt.pipeline.judging.try_claim(stored.group_pk, "k1", "visit", "waiter")
        with rt.db.session() as s:
            claims = s.scalars(select(m.RequestClaim.owner)).all()
    finally:
        rt.close()
    assert token is None and hit is not None
    assert hit.verdict is not None and hit.verdict.level == 2
    assert claims == []


class Recording:
    """A dispatcher that only records what would be sent (a test drives the units)."""

    def __init__(self) -> None:
        self.units: list[Any] = []
        self.aggregations: list[int] = []

    def dispatch(self, units: Any) -> None:
        self.units.extend(units)

    def dispatch_aggregation(self, group_pk: int) -> None:
        self.aggregations.append(group_pk)


def test_sweep_releases_a_missed_waiting_snippet_call_only_once_its_chains_are_done(
    tmp_path: Path, marker_judge: JudgeServer, monkeypatch: Any
) -> None:
    from drcredit.scoring.work.snippet_release import SnippetRelease

    recording = Recording()
    settings = settings_for(f"sqlite:///{tmp_path / 'db.sqlite3'}", marker_judge.url)
    rt = Runtime.build(settings, dispatcher=recording)  # type: ignore[arg-type]
    try:
        sub = rt.pipeline.submit_group("t", saturating_group(skip_saturated_snippets=True))

        def snippet_status() -> str:
            with rt.db.session() as s:
                return s.scalars(
                    select(m.WorkUnit.status).where(
                        m.WorkUnit.group_pk == sub.group_pk, m.WorkUnit.kind == "snippet", m.WorkUnit.rollout_id == "a"
                    )
                ).one()

        assert snippet_status() == "waiting"
        released: list[tuple[int, str]] = []
        original = SnippetRelease.release
        monkeypatch.setattr(
            SnippetRelease, "release", lambda self, g, r: released.append((g, r)) or original(self, g, r)
        )
        rt.pipeline.sweep(0.0)
        # Its visit chains have not run: the sweep leaves it (and its group's lock) alone.
        assert snippet_status() == "waiting" and released == []
        # The chains run, but the release their stores would carry is lost.
        monkeypatch.setattr(SnippetRelease, "may_wait", lambda self, group_pk, rollout_id: False)
        chains = [u for u in recording.units if u.kind == "visit_chain" and u.rollout_id == "a"]
        assert rt.pipeline.run_units(chains) == ["done"] * len(chains)
        assert snippet_status() == "waiting"
        monkeypatch.undo()
        rt.pipeline.sweep(0.0)
        assert snippet_status() == "done"  # saturated: skipped, without a judge call
        assert marker_judge.count("snippet") == 0
    finally:
        rt.close()


def test_sweep_leaves_alone_the_work_of_a_queue_without_a_consumer(tmp_path: Path, marker_judge: JudgeServer) -> None:
    """The worker's sweeper passes the kinds whose queue nobody consumes: their units (and,
    for credit_aggregator, the aggregations) are not sent again; everything else is."""
    from tests.pipeline.test_outcome_judging import judged_group

    recording = Recording()
    settings = settings_for(f"sqlite:///{tmp_path / 'db.sqlite3'}", marker_judge.url)
    rt = Runtime.build(settings, dispatcher=recording)  # type: ignore[arg-type]
    try:
        sub = rt.pipeline.submit_group("t", GroupIn.model_validate(judged_group("skip")))
        sent = Counter(u.kind for u in recording.units)
        assert sent["outcome"] == 2 and sent["visit_chain"] > 0  # rollouts a and b have reports
        recording.units.clear()
        rt.pipeline.sweep(0.0, skip_kinds=["outcome"])
        assert Counter(u.kind for u in recording.units) == {k: n for k, n in sent.items() if k != "outcome"}
        recording.units.clear()
        rt.pipeline.sweep(0.0)
        assert Counter(u.kind for u in recording.units) == sent

        # Every unit done: the aggregation is sent once; a sweep re-sends a stuck one
        # unless its queue has no consumer.
        assert all(o == "done" for o in rt.pipeline.run_units(recording.units))
        assert recording.aggregations == [sub.group_pk]
        rt.pipeline.sweep(0.0, skip_aggregations=True)
        assert recording.aggregations == [sub.group_pk]
        rt.pipeline.sweep(0.0)
        assert recording.aggregations == [sub.group_pk, sub.group_pk]
    finally:
        rt.close()


def test_a_message_naming_a_unit_of_another_kind_leaves_it_alone(database_url: str, marker_judge: JudgeServer) -> None:
    """A message names a unit by its row id; a message of another kind (another stack's
    on the same Redis queues, whose ids run from 1 as ours do) must not run, and so
    finish, the unit of ours that has its id: an outcome message naming a visit chain's
    row finished the chain unjudged and its group's aggregation found no judgment."""
    from tests.pipeline.test_outcome_judging import judged_group

    recording = Recording()
    rt = Runtime.build(settings_for(database_url, marker_judge.url), dispatcher=recording)  # type: ignore[arg-type]
    try:
        sub = rt.pipeline.submit_group("t", GroupIn.model_validate(judged_group("stray")))
        chain = next(u for u in recording.units if u.kind == "visit_chain" and u.rollout_id == "a")
        strays = [
            UnitRef("outcome", chain.unit_id, chain.group_pk, "a"),
            UnitRef("snippet", chain.unit_id, chain.group_pk, "a"),
        ]
        for stray in strays:
            assert rt.pipeline.run_units([stray]) == ["noop"]
        with rt.db.session() as s:
            assert s.get(m.WorkUnit, chain.unit_id).status == "queued"  # type: ignore[union-attr]
        assert all(o == "done" for o in rt.pipeline.run_units(recording.units))
        assert recording.aggregations == [sub.group_pk]
        rt.pipeline.run_aggregation(sub.group_pk)
        with rt.db.session() as s:
            row = documents.find_group(s, "t", sub.group_id, full=True)
            assert (row.status, row.error) == ("done", None)
            rubric_id = s.scalars(select(m.WorkUnit.rubric_id).where(m.WorkUnit.id == chain.unit_id)).one()
            judged = s.scalars(
                select(m.Judgment.turn_index).where(
                    m.Judgment.group_pk == sub.group_pk,
                    m.Judgment.kind == "visit",
                    m.Judgment.rollout_id == "a",
                    m.Judgment.rubric_id == rubric_id,
                )
            ).all()
        assert sorted(judged) == [1, 2]  # the chain's two visits (turn 0 is a search)
    finally:
        rt.close()
