"""Validation of the judge's answers (docs/method.md, "Visit credit" and "Search credit"), independent of any backend.

A visit answer that breaks the rules raises :class:`InvalidAnswer` (the caller retries);
snippet matches are accepted or rejected one by one, each rejection with its reason.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any


class InvalidAnswer(ValueError):
    """The judge's answer breaks the method's rules; the reason is the message."""


@dataclass(frozen=True)
class VisitVerdict:
    level: int
    page_ids: tuple[str, ...]
    support_points: tuple[str, ...]
    rationale: str


MAX_SUPPORT_POINTS = 3


def validate_visit_answer(answer: Any, usable_page_ids: Collection[str]) -> VisitVerdict:
    """Check a visit judgment; level 0 discards page ids and support points."""
    if not isinstance(answer, Mapping):
        raise InvalidAnswer(f"answer must be a JSON object, got {type(answer).__name__}")
    level = answer.get("level")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or level not in (0, 1, 2):
        raise InvalidAnswer(f"level must be 0, 1 or 2, got {level!r}")
    level = int(level)
    rationale = answer.get("rationale")
    rationale = rationale if isinstance(rationale, str) else ""
    if level == 0:
        return VisitVerdict(0, (), (), rationale)
    raw_ids = answer.get("page_ids")
    if not isinstance(raw_ids, list):
        raise InvalidAnswer(f"page_ids must be a list for level {level}, got {raw_ids!r}")
    usable = set(usable_page_ids)
    kept: list[str] = []
    for pid in raw_ids:
        if isinstance(pid, str) and pid in usable and pid not in kept:
            kept.append(pid)
    if not kept:
        raise InvalidAnswer(
            f"level {level} names no usable page of this visit (got {raw_ids!r}, usable {sorted(usable)})"
        )
    points = answer.get("support_points")
    if not isinstance(points, list) or not points:
        raise InvalidAnswer(f"level {level} needs 1-3 support points, got {points!r}")
    for p in points:
        if not isinstance(p, str) or not p.strip():
            raise InvalidAnswer(f"support points must be non-blank strings, got {p!r}")
    return VisitVerdict(level, tuple(kept), tuple(p.strip() for p in points[:MAX_SUPPORT_POINTS]), rationale)


@dataclass(frozen=True)
class SnippetMatch:
    rubric_id: str
    result_id: str
    evidence_quote: str


@dataclass(frozen=True)
class RejectedMatch:
    index: int
    raw: Any
    reason: str


@dataclass(frozen=True)
class SnippetVerdict:
    accepted: tuple[SnippetMatch, ...]
    rejected: tuple[RejectedMatch, ...]


def collapse_whitespace(text: str) -> str:
    """Runs of white space become one space; leading and trailing space is dropped."""
    return " ".join(text.split())


def accept_snippet_matches(
    answer: Any,
    positive_rubric_ids: Collection[str],
    eligible_snippets: Mapping[str, str],
) -> SnippetVerdict:
    """Apply the snippet acceptance rules (docs/method.md, "Search credit") to the judge's matches, in order.

    ``eligible_snippets`` maps each eligible result id to its snippet text. An answer
    that is not ``{"matches": [...]}`` raises :class:`InvalidAnswer`; a malformed entry
    inside the list is only rejected.
    """
    if not isinstance(answer, Mapping):
        raise InvalidAnswer(f"answer must be a JSON object, got {type(answer).__name__}")
    matches = answer.get("matches")
    if not isinstance(matches, list):
        raise InvalidAnswer(f"matches must be a list, got {matches!r}")
    rubrics = set(positive_rubric_ids)
    accepted: list[SnippetMatch] = []
    rejected: list[RejectedMatch] = []
    matched_rubrics: set[str] = set()
    used_quotes: set[str] = set()
    for i, entry in enumerate(matches):
        reason = None
        if not isinstance(entry, Mapping):
            reason = "entry is not an object"
        else:
            rubric_id, result_id, quote = entry.get("rubric_id"), entry.get("result_id"), entry.get("evidence_quote")
            collapsed = collapse_whitespace(quote) if isinstance(quote, str) else ""
            if not isinstance(rubric_id, str) or rubric_id not in rubrics:
                reason = f"rubric {rubric_id!r} is not a positive-weight rubric"
            elif not isinstance(result_id, str) or result_id not in eligible_snippets:
                reason = f"result {result_id!r} is not an eligible result"
            elif not collapsed:
                reason = "evidence_quote is empty"
            elif collapsed not in collapse_whitespace(eligible_snippets[result_id]):
                reason = f"evidence_quote is not a substring of result {result_id}'s snippet"
            elif rubric_id in matched_rubrics:
                reason = f"rubric {rubric_id} already has an accepted match"
            elif collapsed in used_quotes:
                reason = "the same quote was already accepted for another rubric"
            else:
                matched_rubrics.add(rubric_id)
                used_quotes.add(collapsed)
                accepted.append(SnippetMatch(rubric_id, result_id, str(quote)))
        if reason is not None:
            rejected.append(RejectedMatch(i, entry, reason))
    return SnippetVerdict(tuple(accepted), tuple(rejected))


@dataclass(frozen=True)
class ScoreVerdict:
    """An outcome judgment (docs/method.md, "Outcome reward"): a rubric's 0-4 satisfaction or a claim's 0-2 support."""

    score: int
    rationale: str = ""


def validate_score(answer: Any, maximum: int) -> ScoreVerdict:
    """``{"score": 0..maximum}``, an integer (a bool, a float or a string is invalid output)."""
    if not isinstance(answer, Mapping):
        raise InvalidAnswer(f"answer must be a JSON object, got {type(answer).__name__}")
    score = answer.get("score")
    if isinstance(score, bool) or not isinstance(score, int) or not 0 <= score <= maximum:
        raise InvalidAnswer(f"score must be an integer from 0 to {maximum}, got {score!r}")
    rationale = answer.get("rationale")
    return ScoreVerdict(score, rationale if isinstance(rationale, str) else "")
