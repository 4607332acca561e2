"""Turn advantages onto tokens: hand-computed arrays and every validation error."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from drcredit.trainers.tokens import (
    broadcast_advantages,
    broadcast_advantages_torch,
    broadcast_batch,
    policy_spans,
    turn_advantages,
)

ADV = [0.5, -1.0, 2.0]
SPANS = [(0, 3), (5, 8), (8, 10)]
#        turn 0    tool   turn 1    turn 2  outside every span
MASK = [1, 1, 1, 0, 0, 1, 0, 1, 1, 1, 1, 1]
#                          ^ a tool token inside span 1


def test_hand_computed_array() -> None:
    out = broadcast_advantages(ADV, SPANS, MASK)
    assert out.dtype == np.float32 and out.shape == (12,)
    expected = np.array([0.5, 0.5, 0.5, 0, 0, -1, 0, -1, 2, 2, 0, 0], dtype=np.float32)
    np.testing.assert_array_equal(out, expected)


def test_spans_with_or_without_the_tool_tokens_give_the_same_array() -> None:
    mask = [1, 1, 0, 0, 1, 1, 1, 0, 1]
    tight = broadcast_advantages([1.0, -2.0, 3.0], [(0, 2), (4, 7), (8, 9)], mask, length=9)
    loose = broadcast_advantages([1.0, -2.0, 3.0], [(0, 4), (4, 8), (8, 9)], mask, length=9)
    np.testing.assert_array_equal(tight, loose)
    np.testing.assert_array_equal(tight, np.array([1, 1, 0, 0, -2, -2, -2, 0, 3], dtype=np.float32))


def test_accepts_bool_and_float_masks_and_numpy_inputs() -> None:
    as_bool = np.array(MASK, dtype=bool)
    as_float = np.array(MASK, dtype=np.float64)
    spans = [(np.int64(a), np.int64(b)) for a, b in SPANS]
    advantages = [np.float64(x) for x in ADV]
    reference = broadcast_advantages(ADV, SPANS, MASK)
    np.testing.assert_array_equal(broadcast_advantages(advantages, spans, as_bool), reference)
    np.testing.assert_array_equal(broadcast_advantages(ADV, SPANS, as_float), reference)


def test_no_turns_gives_zeros() -> None:
    np.testing.assert_array_equal(broadcast_advantages([], [], [1, 0, 1]), np.zeros(3, dtype=np.float32))


@pytest.mark.parametrize(
    ("advantages", "spans", "mask", "kwargs", "message"),
    [
        ([1.0, 2.0], [(0, 2)], [1, 1, 1], {}, "1 spans for 2 turn advantages"),
        ([1.0], [(0, 4)], [1, 1, 1], {}, "span 0 (0, 4) is out of range for a response of 3 tokens"),
        ([1.0], [(-1, 2)], [1, 1, 1], {}, "span 0 (-1, 2) is out of range"),
        ([1.0, 2.0], [(0, 2), (1, 3)], [1, 1, 1], {}, "span 1 (1, 3) starts before span 0 (0, 2) ends"),
        ([1.0, 2.0], [(2, 3), (0, 1)], [1, 1, 1], {}, "must be in turn order and must not overlap"),
        ([1.0], [(2, 2)], [1, 1, 1], {}, "span 0 (2, 2) is empty or reversed"),
        ([1.0], [(2, 1)], [1, 1, 1], {}, "start must be < end"),
        ([1.0, 2.0], [(0, 1), (1, 3)], [1, 0, 0], {}, "span 1 (1, 3) covers no policy token"),
        ([1.0], [(0, 3)], [1, 1, 1], {"length": 4}, "response mask has 3 tokens but length=4"),
        ([float("nan")], [(0, 3)], [1, 1, 1], {}, "advantage 0 is not finite (nan)"),
        ([1.0, float("inf")], [(0, 1), (1, 3)], [1, 1, 1], {}, "advantage 1 is not finite (inf)"),
        ([None], [(0, 3)], [1, 1, 1], {}, "advantage 0 must be a number"),
        ([1.0], [(0.0, 3)], [1, 1, 1], {}, "span 0 bounds must be integers"),
        ([1.0], [(0, 1, 2)], [1, 1, 1], {}, "span 0 must be a (start, end) pair"),
        ([1.0], [(0, 3)], [1, 2, 1], {}, "must hold only 0 and 1, got 2 at position 1"),
        ([1.0], [(0, 3)], [[1, 1, 1]], {}, "must be 1-D"),
        ([1.0], [(0, 3)], ["a", "b", "c"], {}, "must hold 0/1 values"),
    ],
)
def test_validation_errors(
    advantages: list[Any], spans: list[Any], mask: list[Any], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        broadcast_advantages(advantages, spans, mask, **kwargs)
    assert message in str(info.value)


def test_empty_span_allowed_on_request() -> None:
    out = broadcast_advantages([1.0, 2.0], [(0, 1), (1, 3)], [1, 0, 0], allow_empty_spans=True)
    np.testing.assert_array_equal(out, np.array([1, 0, 0], dtype=np.float32))


def test_policy_spans_are_the_runs_of_ones() -> None:
    assert policy_spans(MASK) == [(0, 3), (5, 6), (7, 12)]
    assert policy_spans([0, 0]) == [] and policy_spans([]) == []
    assert policy_spans([1, 1, 0, 1]) == [(0, 2), (3, 4)]


# ----------------------------------------------------------------------------- batch


def test_batch_with_2d_mask_and_padding() -> None:
    mask = np.array([[1, 1, 0, 1, 0], [1, 0, 1, 1, 1]])
    out = broadcast_batch([[0.5, -1.0], [2.0]], [[(0, 2), (3, 4)], [(0, 5)]], mask, pad_to=7)
    assert out.dtype == np.float32 and out.shape == (2, 7)
    expected = np.array([[0.5, 0.5, 0, -1, 0, 0, 0], [2, 0, 2, 2, 2, 0, 0]], dtype=np.float32)
    np.testing.assert_array_equal(out, expected)


def test_batch_with_ragged_masks_pads_to_the_longest() -> None:
    out = broadcast_batch([[1.0], [-1.0, 3.0]], [[(0, 2)], [(0, 1), (2, 4)]], [[1, 1], [1, 0, 1, 0]])
    np.testing.assert_array_equal(out, np.array([[1, 1, 0, 0], [-1, 0, 3, 0]], dtype=np.float32))
    assert broadcast_batch([], [], []).shape == (0, 0)


@pytest.mark.parametrize(
    ("advantages", "spans", "mask", "pad_to", "message"),
    [
        ([[1.0]], [[(0, 2)]], [[1, 1, 1]], 2, "rollout 0: mask has 3 tokens, more than pad_to=2"),
        ([[1.0], [1.0]], [[(0, 2)], [(0, 9)]], [[1, 1], [1, 1]], None, "rollout 1: span 0 (0, 9) is out of range"),
        ([[1.0]], [[(0, 2)], [(0, 2)]], [[1, 1]], None, "1 advantage lists, 2 span lists, 1 mask rows"),
        ([[1.0]], [[(0, 2)]], [[1, 1]], -1, "pad_to must be a non-negative integer"),
        ([[1.0]], [[(0, 2)]], np.ones((1, 2, 2)), None, "the batch mask must be 2-D"),
        ([[1.0]], [[(0, 2)]], [[1, 5]], None, "rollout 0: the response mask must hold only 0 and 1"),
    ],
)
def test_batch_errors_name_the_row(
    advantages: list[Any], spans: list[Any], mask: Any, pad_to: int | None, message: str
) -> None:
    with pytest.raises(ValueError) as info:
        broadcast_batch(advantages, spans, mask, pad_to=pad_to)
    assert message in str(info.value)


# ----------------------------------------------------------------------------- advantages document


def document() -> dict[str, Any]:
    return {
        "group_id": "g",
        "status": "done",
        "rollouts": [
            {
                "id": "a",
                "turns": [
                    {"index": 1, "type": "answer", "advantage": 0.7},
                    {"index": 0, "type": "search", "advantage": -0.25},
                ],
            },
            {"id": "b", "turns": [{"index": 0, "type": "visit", "advantage": 1}]},
        ],
    }


def test_turn_advantages_in_index_order() -> None:
    assert turn_advantages(document(), "a") == [-0.25, 0.7]
    assert turn_advantages(document(), "b") == [1.0]


@pytest.mark.parametrize(
    ("change", "rollout_id", "message"),
    [
        (lambda d: d.update(status="running"), "a", "the advantages document is 'running', not 'done'"),
        (lambda d: None, "zz", "rollout 'zz' is not in the advantages document (it has 'a', 'b')"),
        (lambda d: d.pop("rollouts"), "a", "no 'rollouts' list"),
        (lambda d: d["rollouts"].append({"id": "a", "turns": []}), "a", "appears 2 times"),
        (lambda d: d["rollouts"][0]["turns"][0].update(index=2), "a", "turn indices are not 0..1: [0, 2]"),
        (lambda d: d["rollouts"][0]["turns"][0].update(index=0), "a", "has turn index 0 twice"),
        (lambda d: d["rollouts"][0]["turns"][1].update(advantage=None), "a", "turn 0 has no finite advantage"),
        (lambda d: d["rollouts"][1]["turns"][0].update(advantage=True), "b", "turn 0 has no finite advantage"),
        (lambda d: d["rollouts"][1]["turns"][0].update(index="0"), "b", "turn 0 has no integer 'index'"),
        (lambda d: d["rollouts"][1].pop("turns"), "b", "rollout 'b' has no 'turns' list"),
    ],
)
def test_turn_advantages_errors(change: Any, rollout_id: str, message: str) -> None:
    doc = document()
    change(doc)
    with pytest.raises(ValueError) as info:
        turn_advantages(doc, rollout_id)
    assert message in str(info.value)


# ----------------------------------------------------------------------------- torch


def test_module_imports_without_torch() -> None:
    code = "import sys, drcredit.trainers; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _torch() -> Any:
    """torch where it is installed. The trainer venv sets DRCREDIT_REQUIRE_TORCH=1 (scripts/test):
    there a missing torch must fail the test, not skip it, or nothing would ever run it."""
    if os.environ.get("DRCREDIT_REQUIRE_TORCH") == "1":
        return importlib.import_module("torch")
    return pytest.importorskip("torch")


def test_torch_tensor() -> None:
    torch = _torch()
    out = broadcast_advantages_torch(ADV, SPANS, torch.tensor(MASK), length=12)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.device.type == "cpu"
    assert out.tolist() == broadcast_advantages(ADV, SPANS, MASK).tolist()
    wide = broadcast_advantages_torch(ADV, SPANS, MASK, dtype=torch.float64, device="cpu")
    assert wide.dtype == torch.float64 and wide.tolist() == pytest.approx(out.tolist())
    with pytest.raises(ValueError, match="span 1"):
        broadcast_advantages_torch(ADV, [(0, 3), (2, 8), (8, 10)], MASK)
