"""A visit's rubric calls go out together (scoring/start_order.py and scoring/priority.py, "together"): a real judge
server records when each call arrives, and the credit is what it is in any order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.pipeline.test_pipeline import levels, runtime, score
from tests.support.builders import group, page, rollout, rubric, visit
from tests.support.judge_server import Call, Reply, marker_answer, running_judge

#: How long the judge takes for each (first page, rubric): A0 x R1 and B0 x R1 are
#: quick, so B's R1 chain becomes ready for its second visit before A's R2 chain does,
#: while B0 x R2 keeps one of the two judge slots busy throughout.
DELAYS = {("A0", "R1"): 0.1, ("A0", "R2"): 0.6, ("B0", "R1"): 0.1, ("B0", "R2"): 2.5}
LATER_VISITS_S = 0.6

GROUP = group(
    rollout(
        "a",
        visit(page("A0", "https://a.org/0", "[R1:2:a0] [R2:1:b0]")),
        visit(page("A1", "https://a.org/1", "[R1:2:a0] [R2:2:b1]")),
        reward=1.0,
    ),
    rollout(
        "b",
        visit(page("B0", "https://b.org/0", "[R1:1:c0]")),
        visit(page("B1", "https://b.org/1", "[R2:1:d1]")),
        reward=0.0,
    ),
    rubrics=[rubric("R1"), rubric("R2")],
)


def script(call: Call) -> Reply:
    if call.kind != "visit":
        return Reply.json(marker_answer(call))
    first = call.document["visit"]["pages"][0]["id"]
    delay = DELAYS.get((first, call.document["rubric_item"]["id"]), LATER_VISITS_S)
    return Reply.json(marker_answer(call), delay=delay)


def scored(tmp_path: Path, concurrency: int) -> tuple[dict[str, Any], list[Call]]:
    tmp_path.mkdir()
    with running_judge(script) as server, runtime(tmp_path, server, judge_concurrency=concurrency) as rt:
        doc = score(rt, GROUP)
    return doc, [c for c in server.calls if c.kind == "visit"]


def test_a_visits_rubric_calls_go_out_beside_each_other_and_the_credit_is_unchanged(tmp_path: Path) -> None:
    """Two judge slots. A's R1 chain is answered first and asks for visit A1; B's R1
    chain (quick) then asks for B1; A's R2 chain asks for A1 last. When A1 x R1 takes
    a slot, A1 x R2 is moved up beside it: it takes the next slot (one call later, about
    0.6 s), not B1 x R1, which asked before it (1.2 s later). With as many slots as
    calls nothing waits; the levels and advantages are the same both ways."""
    doc, calls = scored(tmp_path / "two-slots", 2)
    at = {(c.document["visit"]["pages"][0]["id"], c.document["rubric_item"]["id"]): c.received_at for c in calls}
    order = [key for key, _ in sorted(at.items(), key=lambda kv: kv[1])]
    assert order.index(("A1", "R2")) == order.index(("A1", "R1")) + 1, order
    assert at[("A1", "R2")] - at[("A1", "R1")] < 0.6 + 0.45, at
    assert at[("B1", "R1")] > at[("A1", "R2")], at

    # The marks, by the rule: a point already credited to the rubric is worth nothing.
    assert levels(doc, "a") == [{"R1": 2, "R2": 1}, {"R1": 0, "R2": 2}]
    assert levels(doc, "b") == [{"R1": 1, "R2": 0}, {"R1": 0, "R2": 1}]
    free, _ = scored(tmp_path / "no-wait", 16)
    assert doc["advantages"]["rollouts"] == free["advantages"]["rollouts"]
