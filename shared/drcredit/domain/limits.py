"""Size limits a shared service needs, checked before anything is stored.

Without them one group can cost without bound: 10,000 rubrics are 10,000 judge calls per
visit. Each limit is a setting (``DRCREDIT_MAX_*``); a group over one is refused with a
422 naming the field, the limit and the setting.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from drcredit.domain.errors import FieldError
from drcredit.domain.group import GroupContent, Rollout, SearchTurn, ToolTurn, VisitTurn


@dataclass(frozen=True)
class Limits:
    rubrics: int = 100
    rollouts: int = 256
    turns: int = 512
    #: Results of a search, pages of a visit, queries and URLs of a call, trusted evidence.
    items: int = 100
    #: Characters of any one text field (question, evidence, report, ...).
    text_chars: int = 1_000_000


def _too_many(field: str, count: int, limit: int, setting: str, what: str) -> FieldError:
    return FieldError(field, f"{count} {what} exceed the limit of {limit} (DRCREDIT_{setting})")


def _too_long(field: str, text: str | None, limits: Limits) -> Iterator[FieldError]:
    if text is not None and len(text) > limits.text_chars:
        yield FieldError(
            field, f"{len(text)} characters exceed the limit of {limits.text_chars} (DRCREDIT_MAX_TEXT_CHARS)"
        )


def group_limit_problems(group: GroupContent, limits: Limits, expected_rollouts: int | None = None) -> list[FieldError]:
    problems: list[FieldError] = []
    if len(group.rubrics) > limits.rubrics:
        problems.append(_too_many("rubrics", len(group.rubrics), limits.rubrics, "MAX_RUBRICS", "rubrics"))
    rollouts = max(len(group.rollouts), expected_rollouts or 0)
    if rollouts > limits.rollouts:
        field = "expected_rollouts" if (expected_rollouts or 0) > len(group.rollouts) else "rollouts"
        problems.append(_too_many(field, rollouts, limits.rollouts, "MAX_ROLLOUTS", "rollouts"))
    problems.extend(_too_long("question", group.question, limits))
    for k, rubric in enumerate(group.rubrics):
        problems.extend(_too_long(f"rubrics[{k}].description", rubric.description, limits))
        if len(rubric.trusted_evidence) > limits.items:
            problems.append(
                _too_many(
                    f"rubrics[{k}].trusted_evidence", len(rubric.trusted_evidence), limits.items, "MAX_ITEMS", "items"
                )
            )
        for e, text in enumerate(rubric.trusted_evidence):
            problems.extend(_too_long(f"rubrics[{k}].trusted_evidence[{e}]", text, limits))
    for i, rollout in enumerate(group.rollouts):
        problems.extend(rollout_limit_problems(rollout, limits, f"rollouts[{i}]"))
    return problems


def rollout_limit_problems(rollout: Rollout, limits: Limits, prefix: str = "") -> list[FieldError]:
    here = f"{prefix}." if prefix else ""
    problems: list[FieldError] = []
    if len(rollout.turns) > limits.turns:
        problems.append(_too_many(f"{here}turns", len(rollout.turns), limits.turns, "MAX_TURNS", "turns"))
        return problems
    for t, turn in enumerate(rollout.turns):
        at = f"{here}turns[{t}]"
        problems.extend(_too_long(f"{at}.reasoning", turn.reasoning, limits))
        lists: list[tuple[str, int]] = []
        if isinstance(turn, SearchTurn):
            lists = [("call.queries", len(turn.call.queries)), ("results", len(turn.results))]
            for j, result in enumerate(turn.results):
                problems.extend(_too_long(f"{at}.results[{j}].snippet", result.snippet, limits))
                problems.extend(_too_long(f"{at}.results[{j}].url", result.url, limits))
        elif isinstance(turn, VisitTurn):
            lists = [("call.urls", len(turn.call.urls)), ("pages", len(turn.pages))]
            for j, page in enumerate(turn.pages):
                problems.extend(_too_long(f"{at}.pages[{j}].evidence", page.evidence, limits))
                problems.extend(_too_long(f"{at}.pages[{j}].summary", page.summary, limits))
        elif isinstance(turn, ToolTurn):
            pass
        else:
            problems.extend(_too_long(f"{at}.answer", turn.answer, limits))
        for name, count in lists:
            if count > limits.items:
                problems.append(_too_many(f"{at}.{name}", count, limits.items, "MAX_ITEMS", "items"))
    return problems
