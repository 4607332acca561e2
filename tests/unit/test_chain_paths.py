"""The scheduler's claim of a visit chain: the calls on the longest path of dependent
calls still running through it (``calls_on_path``), counted by hand."""

from __future__ import annotations

from drcredit.domain.credit import calls_on_path


def test_a_chain_with_no_snippet_waiting_on_it_claims_its_own_calls_left() -> None:
    assert calls_on_path((1, 3, 5), set(), []) == 3
    assert calls_on_path((1, 3, 5), {1}, []) == 2
    assert calls_on_path((1, 3, 5), {1, 3, 5}, []) == 0


def test_a_snippet_call_waiting_on_the_chains_last_visit_adds_one_call() -> None:
    # visits 1, 3, 5, then the snippet call that waits on visit 5
    assert calls_on_path((1, 3, 5), set(), [(5,)]) == 4
    assert calls_on_path((1, 3, 5), {1, 3}, [(5,)]) == 2


def test_a_snippet_call_waiting_on_an_earlier_visit_ends_a_shorter_path() -> None:
    # through the snippet: visits 1, 3 and the snippet call (3); the chain alone: 4
    assert calls_on_path((1, 3, 5, 7), set(), [(3,)]) == 4
    # visit 1 done: visit 3 and the snippet (2) against visits 3, 5, 7 (3)
    assert calls_on_path((1, 3, 5, 7), {1}, [(3,)]) == 3


def test_the_snippet_waits_for_the_last_of_its_visits() -> None:
    # it waits on visits 3 and 7: visits 1, 3, 5, 7, then the snippet
    assert calls_on_path((1, 3, 5, 7), set(), [(3, 7)]) == 5
    # two snippet calls: the longer path counts (visits 1, 3, snippet: 3; all four and a snippet: 5)
    assert calls_on_path((1, 3, 5, 7), set(), [(3,), (7,)]) == 5


def test_a_snippet_whose_visits_this_chain_has_judged_no_longer_counts() -> None:
    assert calls_on_path((1, 3, 5, 7), {1, 3}, [(3,)]) == 2
    assert calls_on_path((1, 3), set(), [(9,)]) == 2
