"""The outcome reward the service computes itself (docs/method.md, "Outcome reward"), as pure functions.

Two kinds of judgment feed it: a 0-4 rubric-satisfaction score per (report, rubric with a
non-zero weight) and a 0-2 support score per citation claim (one joint call with all its
resolving pages, one per page when there are several). Everything else is read from
the rollout here: citations and their references, the format checks, the search count
and the report's length. :func:`report_facts` keeps what the reward needs of a rollout
(no page text), so the reward can be recomputed under other ``outcome_weights``,
``search_cap`` and ``length_cap`` from the stored judgments alone.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from drcredit.domain.group import AnswerTurn, Rollout, Rubric, SearchTurn, VisitTurn

#: A citation: ``<cite id="IDS">SPAN</cite>`` whose SPAN holds neither ``<cite`` nor ``</cite>``.
#: The SPAN is runs of anything but ``<``, each ``<`` checked once: checking every character
#: for either string took 0.35 ms for a 12 KB span, this 8 us.
_CITATION = re.compile(r'<cite id="([^"]*)">([^<]*(?:<(?!cite|/cite>)[^<]*)*)</cite>')
_OPENING = '<cite id="'
_WELL_FORMED = re.compile(r"[A-Za-z]+[0-9]+")
#: A Markdown heading at the start of a line (it never spans lines).
_HEADING = re.compile(r"(#{1,6}) +\S")

JOINT = "joint"


@dataclass(frozen=True)
class Citation:
    """One citation of a report: its claim and references (docs/method.md, "Outcome reward")."""

    #: The SPAN with runs of white space collapsed and trimmed.
    claim: str
    references: tuple[str, ...]
    well_formed: tuple[bool, ...]
    #: Distinct resolving pages in order of first mention.
    pages: tuple[str, ...]

    @property
    def scoreable(self) -> bool:
        return bool(self.pages) and any(ch.isalnum() for ch in self.claim)


@dataclass(frozen=True)
class ReportFacts:
    """What the outcome reward needs of one rollout, besides the judgments."""

    has_report: bool
    citations: tuple[Citation, ...] = ()
    malformed_markup: int = 0
    #: The four format checks: answer headings, citation markup, tool calls, reasoning.
    format_checks: tuple[bool, bool, bool, bool] = (False, False, False, False)
    #: Search turns without an error that have a non-blank query.
    searches: int = 0
    #: White-space separated tokens of the report, citations replaced by their SPAN.
    words: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "has_report": self.has_report,
            "citations": [
                {
                    "claim": c.claim,
                    "references": list(c.references),
                    "well_formed": list(c.well_formed),
                    "pages": list(c.pages),
                }
                for c in self.citations
            ],
            "malformed_markup": self.malformed_markup,
            "format_checks": list(self.format_checks),
            "searches": self.searches,
            "words": self.words,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ReportFacts:
        checks = tuple(bool(x) for x in doc.get("format_checks", (False,) * 4))
        return cls(
            has_report=bool(doc["has_report"]),
            citations=tuple(
                Citation(c["claim"], tuple(c["references"]), tuple(c["well_formed"]), tuple(c["pages"]))
                for c in doc.get("citations", ())
            ),
            malformed_markup=int(doc.get("malformed_markup", 0)),
            format_checks=(checks[0], checks[1], checks[2], checks[3]),
            searches=int(doc.get("searches", 0)),
            words=int(doc.get("words", 0)),
        )


def report_of(rollout: Rollout) -> tuple[int, str] | None:
    """(turn index, text) of the rollout's report, or None without one or when it is blank."""
    if rollout.turns and isinstance(rollout.turns[-1], AnswerTurn):
        text = rollout.turns[-1].answer
        if text.strip():
            return len(rollout.turns) - 1, text
    return None


def usable_page_ids(rollout: Rollout) -> set[str]:
    return {p.id for turn in rollout.turns if isinstance(turn, VisitTurn) for p in turn.usable_pages}


def citation_matches(report: str) -> list[re.Match[str]]:
    """The report's citations left to right without overlap, as ``_CITATION.finditer``
    finds them, but tried only where a citation's literal opening is: the regex engine
    alone tries every position of the report (1 ms for a 37 KB report, paid at ingest and
    again by its outcome unit)."""
    found = []
    at = report.find(_OPENING)
    while at >= 0:
        match = _CITATION.match(report, at)
        if match is None:
            at = report.find(_OPENING, at + 1)
        else:
            found.append(match)
            at = report.find(_OPENING, match.end())
    return found


def parse_citations(report: str, resolving: set[str]) -> tuple[list[Citation], int]:
    """The report's citations left to right, and its count of malformed markup."""
    return _citations(report, citation_matches(report), resolving)


def _citations(report: str, matches: list[re.Match[str]], resolving: set[str]) -> tuple[list[Citation], int]:
    citations = []
    for match in matches:
        refs = tuple(part.strip() for part in match.group(1).split(",") if part.strip())
        well = tuple(bool(_WELL_FORMED.fullmatch(r)) and r.isascii() for r in refs)
        pages = tuple(dict.fromkeys(r for r in refs if r in resolving))
        # Runs of white space collapsed and trimmed (``str.split`` and ``\s`` agree on it).
        citations.append(Citation(" ".join(match.group(2).split()), refs, well, pages))
    markup = report.count("<cite") + report.count("</cite>")
    return citations, markup - 2 * len(citations)


def _spans_only(report: str, matches: list[re.Match[str]]) -> str:
    """The report with each citation replaced by its span."""
    pieces: list[str] = []
    last = 0
    for match in matches:
        pieces += (report[last : match.start()], match.group(2))
        last = match.end()
    pieces.append(report[last:])
    return "".join(pieces)


def heading_levels(report: str) -> list[int]:
    """The level of each Markdown heading in the report: lines starting with ``#`` matched
    one by one (a multi-line regex tries every position of the report)."""
    return [len(m.group(1)) for line in report.split("\n") if line[:1] == "#" and (m := _HEADING.match(line))]


def report_facts(rollout: Rollout) -> ReportFacts:
    found = report_of(rollout)
    if found is None:
        return ReportFacts(has_report=False)
    _, report = found
    matches = citation_matches(report)
    citations, malformed = _citations(report, matches, usable_page_ids(rollout))
    marks = heading_levels(report)
    answer_ok = len(marks) >= 2 and len(set(marks)) >= 2
    markup_ok = (
        bool(citations)
        and malformed == 0
        and all(any(ch.isalnum() for ch in c.claim) and all(c.well_formed) for c in citations)
    )
    tools_ok = all(_tool_call_ok(turn) for turn in rollout.turns)
    reasoning_ok = all(turn.reasoning.strip() for turn in rollout.turns)
    searches = sum(
        1 for t in rollout.turns if isinstance(t, SearchTurn) and not t.error and any(q.strip() for q in t.call.queries)
    )
    return ReportFacts(
        has_report=True,
        citations=tuple(citations),
        malformed_markup=malformed,
        format_checks=(answer_ok, markup_ok, tools_ok, reasoning_ok),
        searches=searches,
        words=len(_spans_only(report, matches).split()),
    )


def _tool_call_ok(turn: Any) -> bool:
    if isinstance(turn, SearchTurn):
        return 1 <= len(turn.call.queries) <= 2 and all(q.strip() for q in turn.call.queries)
    if isinstance(turn, VisitTurn):
        urls = turn.call.urls
        return 1 <= len(urls) <= 2 and all(u.strip() for u in urls) and bool(turn.call.goal.strip())
    return True


def judged_rubrics(rubrics: Sequence[Rubric]) -> list[Rubric]:
    """Rubrics a report is judged against: every one with a non-zero weight (penalties too)."""
    return [r for r in rubrics if r.weight != 0]


def citation_calls(citation: Citation) -> list[str]:
    """The calls a scoreable claim makes: ``joint``, then one per page when there are several."""
    if not citation.scoreable:
        return []
    return [JOINT, *citation.pages] if len(citation.pages) >= 2 else [JOINT]


# --------------------------------------------------------------------------- the reward


@dataclass(frozen=True)
class ClaimScore:
    claim: str
    references: tuple[str, ...]
    pages: tuple[str, ...]
    joint: int | None = None
    individual: Mapping[str, int] = field(default_factory=dict)
    #: None when left out (a failed call) or unscoreable (scored 0 without a call).
    score: float | None = None
    #: Why it was not scored by the judge: ``unscoreable`` or ``failed``.
    note: str | None = None


@dataclass(frozen=True)
class OutcomeBreakdown:
    #: None when the rollout's reward is unscorable under ``exclude`` (docs/method.md, "Judge failures").
    reward: float | None
    rubric: float
    format: float
    search: float
    cite: float
    length: float
    r_id: float
    r_semantic: float
    rubric_scores: Mapping[str, int | None]
    claims: tuple[ClaimScore, ...]
    #: A rubric judgment failed: under ``exclude`` the reward is null.
    unscorable: bool = False


def claim_score(joint: int, individual: Sequence[int]) -> float:
    """Harmonic mean of a = j / 2 and b = share of pages with a score of at least 1."""
    a = joint / 2
    b = sum(1 for s in individual if s >= 1) / len(individual)
    return 0.0 if a + b == 0 else 2 * a * b / (a + b)


def outcome_breakdown(
    facts: ReportFacts,
    rubrics: Sequence[Rubric],
    rubric_scores: Mapping[str, int | None],
    citation_scores: Mapping[tuple[int, str], int | None],
    weights: Mapping[str, float],
    search_cap: float,
    length_cap: float,
    exclude: bool,
) -> OutcomeBreakdown:
    """The reward of one rollout (docs/method.md, "Outcome reward") and every part of it.

    ``rubric_scores``: per judged rubric id its 0-4 score, None when the judgment failed
    (0 under ``zero``; under ``exclude`` the reward is None). ``citation_scores``: per
    (citation index, ``joint`` or page id) its 0-2 score, None when the call failed (the
    claim is then left out of the average).
    """
    if not facts.has_report:
        zero = OutcomeBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, {}, ())
        return zero
    positive = math.fsum(r.weight for r in rubrics if r.weight > 0)
    judged = judged_rubrics(rubrics)
    failed = any(rubric_scores.get(r.id) is None for r in judged)
    r_rubric = math.fsum(r.weight * (rubric_scores.get(r.id) or 0) / 4 for r in judged) / positive

    well = sum(sum(c.well_formed) for c in facts.citations)
    resolving = sum(
        1 for c in facts.citations for ref, ok in zip(c.references, c.well_formed, strict=True) if ok and ref in c.pages
    )
    r_id = resolving / well if well else 0.0
    claims: list[ClaimScore] = []
    for k, citation in enumerate(facts.citations):
        if not citation.scoreable:
            claims.append(
                ClaimScore(citation.claim, citation.references, citation.pages, score=0.0, note="unscoreable")
            )
            continue
        joint = citation_scores.get((k, JOINT))
        individual = (
            {p: citation_scores.get((k, p)) for p in citation.pages}
            if len(citation.pages) >= 2
            else {citation.pages[0]: joint}
        )
        if joint is None or any(v is None for v in individual.values()):
            known = {p: v for p, v in individual.items() if v is not None}
            claims.append(ClaimScore(citation.claim, citation.references, citation.pages, joint, known, None, "failed"))
            continue
        scores = [int(v) for v in individual.values() if v is not None]
        claims.append(
            ClaimScore(
                citation.claim,
                citation.references,
                citation.pages,
                joint,
                {p: int(v) for p, v in individual.items() if v is not None},
                claim_score(joint, scores),
            )
        )
    kept = [c.score for c in claims if c.score is not None]
    r_semantic = math.fsum(kept) / len(kept) if kept else 0.0
    r_cite = 0.4 * r_id + 0.6 * r_semantic if facts.citations else 0.0
    r_format = sum(facts.format_checks) / 4
    r_search = min(1.0, facts.searches / search_cap)
    r_length = min(1.0, facts.words / length_cap)
    reward = (
        weights["rubric"] * r_rubric
        + weights["format"] * r_format
        + weights["search"] * r_search
        + weights["cite"] * r_cite
        + weights["length"] * r_length
    )
    return OutcomeBreakdown(
        None if (exclude and failed) else reward,
        r_rubric,
        r_format,
        r_search,
        r_cite,
        r_length,
        r_id,
        r_semantic,
        {r.id: rubric_scores.get(r.id) for r in judged},
        tuple(claims),
        failed,
    )
