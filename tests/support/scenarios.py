"""The hand-worked example group shared by the API and SDK tests.

Credits under the marker judge and default parameters, worked out by hand:

a (reward 1): t0 search [S1 u1 (visited at t1), S2 n1 "[R2]"]; t1 visit u1 -> R1 2, R2 1
-> cv 0.7; t2 visit u2 repeats f1 -> 0 (history); t0 = cnav 0.7 + one snippet match 0.1
= 0.8. b (reward 0): t0 visit u1 -> 0.7 (own history); t1 search, S1 visited before,
S2 n2 "[R1] [R2]" -> 2 matches -> 0.2; t2 tool -> 0; no answer turn.
"""

from __future__ import annotations

from typing import Any

from tests.support.builders import answer, group_doc, page, rollout, rubric, search, tool, visit

RUBRICS = [rubric("R1", weight=2.0), rubric("R2", kind="logical"), rubric("P", weight=-1.0)]
CREDITS: dict[str, list[float | None]] = {"a": [0.8, 0.7, 0.0, None], "b": [0.7, 0.2, 0.0]}


def rollout_a() -> dict[str, Any]:
    return rollout(
        "a",
        search(("S1", "https://u1.org/p"), ("S2", "https://n1.org/p", "It is [R2] true.")),
        visit(page("W1", "https://u1.org/p", "[R1:2:f1] text [R2:1:g1]")),
        visit(page("W2", "https://u2.org/p", "again [R1:2:f1]")),
        answer(),
        reward=1.0,
    )


def rollout_b() -> dict[str, Any]:
    return rollout(
        "b",
        visit(page("W1", "https://www.u1.org/p/", "[R1:2:f1] text [R2:1:g1]")),
        search(("S1", "https://u1.org/p"), ("S2", "https://n2.org/p", "[R1] and [R2]")),
        tool(),
        reward=0.0,
    )


def hand_worked_group(**extra: Any) -> dict[str, Any]:
    return group_doc(rollout_a(), rollout_b(), rubrics=RUBRICS, **extra)


#: A visit whose page carries this is failed by the API drift tests' judge (tests/api/test_drift.py).
FAIL = "[fail-this-visit]"


def _evidence(level: int | str, point: str) -> str:
    return FAIL if level == "fail" else f"[R1:{level}:{point}]" if level else "nothing relevant"


def drift_group(gid: str, step: int, visits: tuple[int | str, int | str], reports: tuple[int, int]) -> dict[str, Any]:
    """A group of run ``drifting``: rollouts a and b each visit a page marked with R1's level
    (or :data:`FAIL`) and end with a report marked with R1's score (``outcome_source: judge``)."""
    rollouts = [
        rollout(
            rid,
            visit(page("W1", f"https://{gid}-{rid}.org/p", _evidence(level, f"{gid}{rid}"))),
            answer(f"the report [R1={score}]"),
            reward=None,
        )
        for rid, level, score in zip(("a", "b"), visits, reports, strict=True)
    ]
    return group_doc(
        *rollouts,
        rubrics=[rubric("R1")],
        params={"outcome_source": "judge"},
        group_id=gid,
        metadata={"run": "drifting", "step": step},
    )


#: Five steps whose levels drift at step 4 and come back at step 5 (tests/api/test_drift.py
#: works out every figure).
DRIFT_GROUPS = [
    drift_group("s1", 1, (2, 0), (4, 0)),
    drift_group("s2", 2, (1, 2), (4, 2)),
    drift_group("s3", 3, (0, 1), (0, 2)),
    drift_group("s4", 4, (2, 2), (4, 4)),
    drift_group("s5x", 5, (0, 1), (0, 2)),
    drift_group("s5y", 5, (2, "fail"), (4, 2)),
]
