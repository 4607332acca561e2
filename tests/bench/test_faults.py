"""The fault campaign's own parts (bench.faults): its checks catch what they claim, its
schedule deals every kind, its simulated judge's garbage is no judgment."""

from __future__ import annotations

import asyncio
import copy
import random
from typing import Any

import orjson
import pytest
from bench.fault_checks import StepResult, max_difference, step_violations
from bench.fault_kinds import KINDS, Injector, Schedule
from bench.judge_sim import Simulator

from drcredit.domain.verdicts import InvalidAnswer, validate_visit_answer
from drcredit.judges.base import parse_json_answer
from drcredit.judges.openai_wire import completion_of
from drcredit.judges.results import RetryableError


def doc() -> dict[str, Any]:
    turns = [
        {"index": 0, "type": "search", "credit": 0.5, "advantage": 0.25},
        {"index": 1, "type": "visit", "credit": None, "advantage": -0.1},
        {"index": 2, "type": "answer", "credit": None, "advantage": 0.75},
    ]
    return {"g": {"rollouts": [{"id": "r0", "outcome_advantage": 0.75, "turns": turns}]}}


def test_the_same_documents_differ_by_nothing() -> None:
    assert max_difference(doc(), doc()) == 0.0


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("outcome_advantage",), 0.5, 0.25),  # |0.5 - 0.75|
        (("turns", 0, "advantage"), 0.0, 0.25),  # |0 - 0.25|
        (("turns", 0, "credit"), 0.125, 0.375),  # |0.125 - 0.5|
        (("turns", 1, "credit"), 0.0, float("inf")),  # null on one side only
    ],
)
def test_a_difference_in_any_value_is_found(path: tuple[Any, ...], value: Any, expected: float) -> None:
    got = copy.deepcopy(doc())
    target = got["g"]["rollouts"][0]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert max_difference(got, doc()) == expected


def test_a_missing_group_or_turn_is_an_infinite_difference() -> None:
    assert max_difference({}, doc()) == float("inf")
    short = copy.deepcopy(doc())
    short["g"]["rollouts"][0]["turns"].pop()
    assert max_difference(short, doc()) == float("inf")


def test_a_step_is_bound_from_the_later_of_its_post_and_its_last_fault() -> None:
    # posted at 10, last fault over at 40, done at 100.5: 60.5 s after the fault
    late = StepResult(0, "b", posted=10.0, done=100.5, last_fault_end=40.0)
    assert late.since_last_fault_s == 60.5
    assert [c for c, _ in step_violations(late)] == ["bound"]
    # a fault over before the post: the post counts (done 59 s after it)
    early = StepResult(1, "b", posted=30.0, done=89.0, last_fault_end=20.0)
    assert early.since_last_fault_s == 59.0 and step_violations(early) == []
    # done while a fault is under way
    during = StepResult(2, "b", posted=0.0, done=500.0, last_fault_end=float("inf"))
    assert during.since_last_fault_s == 0.0 and step_violations(during) == []


def test_each_failing_check_of_a_step_is_named() -> None:
    step = StepResult(3, "b", posted=0.0, done=5.0, max_diff=1e-6, failed_judgments=2, failed_groups=["g"])
    assert sorted(c for c, _ in step_violations(step)) == ["exact", "failed", "lost"]
    assert [c for c, _ in step_violations(StepResult(4, "b", 0.0, lost=True))] == ["lost"]


def test_the_schedule_deals_every_kind_once_a_round_in_a_seeded_order() -> None:
    def dealt(seed: int) -> list[str]:
        injector = Injector(stack=None, rng=random.Random(seed), down_s=(1, 2), clock=lambda: 0.0)  # type: ignore[arg-type]
        schedule = Schedule(injector, KINDS, gap_s=1.0, enough=lambda: False)
        return [schedule.next_kind() for _ in range(3 * len(KINDS))]

    first = dealt(5)
    for r in range(3):
        assert sorted(first[r * len(KINDS) : (r + 1) * len(KINDS)]) == sorted(KINDS)
    assert dealt(5) == first
    assert dealt(6) != first


def test_the_simulated_judges_garbage_is_no_judgment() -> None:
    """Each of its three shapes is rejected by the platform: an unreadable completion, or a
    completion whose content is no verdict."""
    sim = Simulator(latency=0.0, sigma=0.0, concurrency=0, error_rate=0.0, seed=1)
    sim.garbage_until = float("inf")
    user = {"visit": {"pages": [{"id": "W1", "evidence": "{F1}"}]}, "rubric_item": {"id": "R1"}}
    content = orjson.dumps(user | {"support_already_credited": []}).decode()
    request = orjson.dumps({"model": "sim", "messages": [{"role": "user", "content": content}]})
    rejected = 0
    for _ in range(3):
        status, body, _ = asyncio.run(sim.completion(request))
        assert status == 200
        try:
            text = completion_of(body, "http://sim", 512, None, False).text
            validate_visit_answer(parse_json_answer(text), {"W1"})
        except (RetryableError, InvalidAnswer):
            rejected += 1
    assert rejected == 3 and sim.stats["garbage"] == 3
