"""Bias, marginals and people's labels (docs/audit.md), one test per rule, worked by hand.

The bias and both sides' marginals of an audit's pairs (and why a kappa can look good over
a biased judge), the lower median of several labels, an audit against labels (left-out
keys, unlabeled keys, first visits) and two labelers compared with each other.
"""

from __future__ import annotations

import pytest

from drcredit.audit.labels.compare import human_report, labeler_pairs, pair_with_labels
from drcredit.audit.labels.keys import Original, item_id, originals, parse_item_id, parse_key
from drcredit.audit.report import agreement_json, with_bias
from drcredit.domain.agreement import agreement, bias, lower_median, marginals
from drcredit.domain.errors import InvalidInput

# ----------------------------------------------------------------------------- bias, marginals


def test_bias_is_the_mean_of_audit_minus_original() -> None:
    # (0, 1) +1, (2, 2) 0, (4, 1) -3, (3, 4) +1: sum -1 over 4 pairs.
    assert bias([(0, 1), (2, 2), (4, 1), (3, 4)]) == pytest.approx(-1 / 4)
    assert bias([]) is None


def test_marginals_are_each_sides_shares_per_category() -> None:
    # Original: 0, 1, 1, 2 -> (1/4, 1/2, 1/4); audit: 1, 1, 2, 2 -> (0, 1/2, 1/2).
    got = marginals([[0, 1, 0], [0, 1, 1], [0, 0, 1]])
    assert got is not None
    assert got.original == pytest.approx([1 / 4, 1 / 2, 1 / 4])
    assert got.audit == pytest.approx([0, 1 / 2, 1 / 2])
    assert marginals([[0, 0], [0, 0]]) is None


def test_a_judge_that_reads_every_1_as_2_keeps_a_high_kappa_but_shows_its_bias() -> None:
    # 4 pairs at each level, the audit judge says 2 wherever the original said 1.
    pairs = [(0, 0)] * 4 + [(1, 2)] * 4 + [(2, 2)] * 4
    got = agreement(pairs, 2)
    # sum w O = 1/4 * 4/12 = 1/12. Rows (1/3, 1/3, 1/3), columns (1/3, 0, 2/3):
    # sum w E = 1 (1/3 * 2/3) [0,2] + 1/4 (1/3 * 1/3) [1,0] + 1/4 (1/3 * 2/3) [1,2] + 1 (1/3 * 1/3) [2,0]
    #         = 8/36 + 1/36 + 2/36 + 4/36 = 15/36.
    assert got.kappa == pytest.approx(1 - (1 / 12) / (15 / 36))  # 0.8, above the usual warning line
    assert got.bias == pytest.approx(4 / 12)
    assert got.marginals is not None
    assert got.marginals.original == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert got.marginals.audit == pytest.approx([1 / 3, 0, 2 / 3])
    doc = agreement_json(got)
    assert doc["bias"] == pytest.approx(1 / 3) and doc["marginals"]["audit"] == pytest.approx([1 / 3, 0, 2 / 3])


# ----------------------------------------------------------------------------- lower median


def test_the_lower_median_of_an_odd_count_is_the_middle_value() -> None:
    # k = 3, ceil(3/2) = 2: the second of (0, 1, 2); k = 5: the third of (0, 0, 1, 2, 2).
    assert lower_median([2, 0, 1]) == 1
    assert lower_median([2, 0, 2, 1, 0]) == 1
    assert lower_median([4]) == 4


def test_the_lower_median_of_an_even_count_is_the_lower_middle_value() -> None:
    # k = 2: v1 of (1, 2); k = 4: v2 of (0, 1, 3, 4).
    assert lower_median([2, 1]) == 1
    assert lower_median([4, 0, 3, 1]) == 1
    with pytest.raises(ValueError):
        lower_median([])


# ----------------------------------------------------------------------------- pairs with labels

V = "visit"


def test_labels_pair_with_the_original_at_their_key_unlabeled_keys_are_no_pairs() -> None:
    original = {(V, "a", 1, "R1"): Original("ok", 2), (V, "a", 1, "R2"): Original("ok", 0)}
    labels = {(V, "a", 1, "R1"): {"ann": 1, "ben": 2}}  # lower median of (1, 2): 1
    pairs, left_out, _, _ = pair_with_labels(original, labels, history=True)[V]
    assert (pairs, left_out) == ([(2, 1)], 0)


def test_a_key_whose_original_failed_is_left_out() -> None:
    original = {(V, "a", 1, "R1"): Original("failed", None), (V, "a", 3, "R1"): Original("ok", 1, history=2)}
    labels = {(V, "a", 1, "R1"): {"ann": 2}, (V, "a", 3, "R1"): {"ann": 1}}
    pairs, left_out, first, first_left_out = pair_with_labels(original, labels, history=True)[V]
    assert (pairs, left_out) == ([(1, 1)], 1)
    # The failed visit had an empty history (first visit); the other was shown 2 points.
    assert (first, first_left_out) == ([], 1)


def test_without_history_every_labeled_visit_is_a_first_visit() -> None:
    original = {(V, "a", 3, "R1"): Original("ok", 1, history=2)}
    _, _, first, _ = pair_with_labels(original, {(V, "a", 3, "R1"): {"ann": 0}}, history=False)[V]
    assert first == [(1, 0)]


def test_two_labelers_are_compared_on_the_keys_both_labeled_first_by_name_as_original() -> None:
    labels = {
        (V, "a", 1, "R1"): {"ben": 2, "ann": 1},
        (V, "a", 1, "R2"): {"ann": 0},
        ("snippet", "a", 0, "R1"): {"ann": 1, "ben": 1, "cat": 0},
    }
    got = labeler_pairs([labels])
    assert got[("ann", "ben")][V] == [(1, 2)] and got[("ann", "ben")]["snippet"] == [(1, 1)]
    assert got[("ann", "cat")]["snippet"] == [(1, 0)] and got[("ben", "cat")]["snippet"] == [(1, 0)]
    assert got[("ann", "cat")][V] == []


def test_the_report_pools_groups_and_has_null_figures_for_kinds_without_pairs() -> None:
    g1 = ({(V, "a", 1, "R1"): Original("ok", 1)}, {(V, "a", 1, "R1"): {"ann": 2}}, True)
    g2 = ({(V, "b", 1, "R1"): Original("ok", 0)}, {(V, "b", 1, "R1"): {"ann": 0}}, True)
    report = human_report([g1, g2])
    visit = report["agreement"]["visit"]
    assert (visit["pairs"], visit["exact"], visit["bias"]) == (2, 0.5, 0.5)
    assert report["agreement"]["citation"] == {
        "pairs": 0, "left_out": 0, "exact": None, "kappa": None,
        "confusion": [[0] * 3 for _ in range(3)], "bias": None, "marginals": None,
    }  # fmt: skip
    assert report["labelers"] == {"labels": {"ann": 2}, "pairs": []} and report["labeled_keys"] == 2


# ----------------------------------------------------------------------------- keys


def test_the_keys_are_those_the_audit_compares() -> None:
    rows = [
        ("visit", "a", 1, "R1", "ok", 2, None, 1),
        ("visit", "a", 2, "R1", "deterministic", 0, None, 0),  # no usable page: no call, no key
        ("snippet", "a", 0, "", "ok", 1, [{"rubric_id": "R2", "result_id": "S1"}], None),
        ("snippet", "a", 4, "", "skipped", None, None, None),  # saturated: never judged
        ("rubric", "a", 5, "R1", "ok", 3, None, None),
        ("citation", "a", 5, "0:joint", "ok", 2, None, None),
        ("citation", "a", 5, "0:W1", "ok", 1, None, None),  # one page of the claim: not a key
        ("citation", "a", 5, "1:joint", "failed", None, None, None),
    ]
    got = originals(rows, ["R1", "R2"])
    assert got == {
        ("visit", "a", 1, "R1"): Original("ok", 2, 1),
        ("snippet", "a", 0, "R1"): Original("ok", 0),
        ("snippet", "a", 0, "R2"): Original("ok", 1),
        ("report_rubric", "a", -1, "R1"): Original("ok", 3),
        ("citation", "a", -1, "0"): Original("ok", 2),
        ("citation", "a", -1, "1"): Original("failed", None),
    }


def test_an_item_id_carries_its_group_and_key_and_a_bad_one_is_refused() -> None:
    key = ("citation", "r/0 é", -1, "3")
    assert parse_item_id(item_id("g:1", key)) == ("g:1", key)
    assert parse_key("citation", {"rollout_id": "r/0 é", "claim": 3}) == key
    for bad in ("itm-", "itm-!!!", "nope", 7):
        with pytest.raises(InvalidInput, match="item_id: not an item id"):
            parse_item_id(bad)


def test_a_report_stored_without_bias_gets_it_from_its_confusion_matrix() -> None:
    # Pairs behind [[1, 1], [0, 2]]: (0, 0), (0, 1), (1, 1), (1, 1): bias 1/4;
    # original (2/4, 2/4), audit (1/4, 3/4).
    old = {"snippet": {"pairs": 4, "left_out": 0, "exact": 0.75, "kappa": 0.5, "confusion": [[1, 1], [0, 2]]}}
    got = with_bias(old)["snippet"]
    assert got["bias"] == pytest.approx(1 / 4)
    assert got["marginals"] == {"original": pytest.approx([0.5, 0.5]), "audit": pytest.approx([0.25, 0.75])}
    assert with_bias({"citation": {"confusion": [[0] * 3] * 3}})["citation"]["bias"] is None
