"""The groups the viewer's tests look at, beside the hand-worked ones of the API tests.

``judged_group``: the service judges the outcome (marker judge: ``[R1=4]`` in a report
scores R1 at 4, ``[support=2]`` in a page gives the claims citing it 2). Worked out by hand
with the default weights (rubric 0.70, format 0.05, search 0.05, cite 0.15, length 0.05):

- a: rubric (2 x 4/4 + 1 x 2/4 - 1 x 0/4) / 3 = 5/6; format 4/4 (two heading levels, clean
  markup, good calls, reasoning everywhere); search 1/5; r_id 3/3 (W1; W1, W2 all
  resolve); claims "opened in 2019" (W1 alone, joint 2 -> 1) and "two pages" (joint 2,
  pages W1 2, W2 0 -> harmonic mean of 1 and 1/2 = 2/3), r_semantic 5/6, cite 0.4 + 0.6 x
  5/6 = 0.9; 20 words -> length 0.01. Reward 0.7 x 5/6 + 0.05 + 0.01 + 0.135 + 0.0005.
- b: rubric 2 x 1/4 / 3 = 1/6; format 3/4 (no headings); no search; its one citation (X9)
  resolves to no page: r_id 0/1, the claim scores 0 without a call, r_semantic 0, cite 0;
  4 words -> 0.002. Reward 0.7/6 + 0.0375 + 0.0001.
- c: no report: reward 0 and no judge call.
"""

from __future__ import annotations

from typing import Any

from tests.support.builders import answer, group_doc, page, rollout, rubric, search, tool, visit

JUDGED_RUBRICS = [rubric("R1", 2.0), rubric("R2", 1.0, kind="logical"), rubric("P", -1.0)]
REPORT_A = (
    '# Report\n## Detail\nClaim one <cite id="W1">opened in 2019</cite>. '
    'Both <cite id="W1, W2">two pages</cite>. [R1=4] [R2=2] [P=0] and five more words here'
)
REPORT_B = 'plain report [R1=1] <cite id="X9">gone</cite>'

#: Per rollout: the five components, r_id, r_semantic (worked out above).
JUDGED_PARTS: dict[str, dict[str, float]] = {
    "a": {"rubric": 5 / 6, "format": 1.0, "search": 0.2, "cite": 0.9, "length": 0.01, "r_id": 1.0, "r_semantic": 5 / 6},
    "b": {"rubric": 1 / 6, "format": 0.75, "search": 0.0, "cite": 0.0, "length": 0.002, "r_id": 0.0, "r_semantic": 0.0},
}
WEIGHTS = {"rubric": 0.7, "format": 0.05, "search": 0.05, "cite": 0.15, "length": 0.05}
JUDGED_REWARDS = {"a": 0.7 * 5 / 6 + 0.05 + 0.01 + 0.135 + 0.0005, "b": 0.7 / 6 + 0.0375 + 0.0001, "c": 0.0}


def judged_group(group_id: str, **extra: Any) -> dict[str, Any]:
    a = rollout(
        "a",
        search(("S1", "https://u1.org/p")),
        visit(page("W1", "https://u1.org/p", "[R1:2:f1] text [support=2]")),
        visit(page("W2", "https://u2.org/p", "other text [support=0]")),
        answer(REPORT_A),
        reward=None,
    )
    b = rollout("b", visit(page("W1", "https://u3.org/p", "[R2:1:g1] more")), answer(REPORT_B), reward=None)
    c = rollout("c", visit(page("W1", "https://u4.org/p", "nothing")), reward=None)
    return group_doc(a, b, c, rubrics=JUDGED_RUBRICS, params={"outcome_source": "judge"}, group_id=group_id, **extra)


#: Turns of the long rollout: far more than fit beside the details panel.
LONG_TURNS = 35


def long_group(group_id: str) -> dict[str, Any]:
    """A 35-turn rollout (17 search-visit pairs and the answer) beside a 4-turn one."""
    turns: list[dict[str, Any]] = []
    for k in range(LONG_TURNS // 2):
        url = f"https://long.org/{k}"
        turns += [search((f"S{k}", url)), visit(page(f"W{k}", url, f"[R{1 + k % 2}:{1 + k % 2}:p{k}] page {k}"))]
    turns.append(answer())
    short = rollout(
        "short",
        search(("S1", "https://s.org/1")),
        visit(page("W1", "https://s.org/1", "[R1:2:q]")),
        tool(),
        answer(),
        reward=0.0,
    )
    return group_doc(
        rollout("long", *turns, reward=1.0), short, rubrics=[rubric("R1"), rubric("R2")], group_id=group_id
    )


def step_group(run: str, step: int) -> dict[str, Any]:
    """A small group of one training step; only every fourth step needs the judge (the
    others' page failed to load: level 0 without a call), so 200 of them score fast."""
    judged = step % 4 == 0
    w1 = page("W1", "https://x.org/1", "[R1:2:f]") if judged else page("W1", "https://x.org/1", error="timeout")
    share = (step % 7) / 7
    a = rollout("a", search(("S1", "https://x.org/1")), visit(w1), answer(), reward=share)
    b = rollout("b", tool(), answer(), reward=1 - share)
    return group_doc(a, b, group_id=f"{run}-{step}", metadata={"run": run, "step": step})
