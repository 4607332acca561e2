"""The outcome half of a group (docs/method.md, "Outcome reward"): planning, stored judgments, rewards.

With ``outcome_source: judge`` every rollout with a report gets one ``outcome`` unit
(drcredit.scoring.work.outcome_unit) that judges the report against each rubric with a
non-zero weight and each scoreable citation claim against its pages. This module holds
what ingest, aggregation, replay and the documents share: which calls a rollout needs,
how its judgments are keyed, and the reward computed from them (pure math in
drcredit.domain.outcome).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from drcredit.domain.group import Rollout, Rubric
from drcredit.domain.outcome import (
    JOINT,
    OutcomeBreakdown,
    ReportFacts,
    citation_calls,
    judged_rubrics,
    outcome_breakdown,
    report_of,
)
from drcredit.domain.params import ScoringParams
from drcredit.scoring.intake.content import request_digest
from drcredit.storage import models as m

RUBRIC, CITATION = "rubric", "citation"
OUTCOME_KINDS = (RUBRIC, CITATION)


def citation_key(claim: int, call: str) -> str:
    """The ``rubric_id`` column of a citation judgment: claim index and ``joint`` or page id."""
    return f"{claim}:{call}"


def planned_calls(facts: ReportFacts, rubrics: Sequence[Rubric]) -> list[tuple[str, str]]:
    """(kind, key) of every outcome call a rollout needs, in the order they are made."""
    if not facts.has_report:
        return []
    calls = [(RUBRIC, r.id) for r in judged_rubrics(rubrics)]
    for k, citation in enumerate(facts.citations):
        calls.extend((CITATION, citation_key(k, call)) for call in citation_calls(citation))
    return calls


def page_evidence(rollout: Rollout) -> dict[str, tuple[str, str]]:
    """(url, evidence) of each usable page of the rollout's visits, by page id."""
    return {p.id: (p.url, p.evidence or "") for t in rollout.turns for p in getattr(t, "usable_pages", [])}


def citation_call(
    facts: ReportFacts, pages: Mapping[str, tuple[str, str]], key: str
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The claim and the (url, evidence) of the pages a citation call (its key) shows the judge."""
    claim, _, call = key.partition(":")
    citation = facts.citations[int(claim)]
    cited = citation.pages if call == JOINT else (call,)
    return citation.claim, tuple(pages[p] for p in cited)


def call_signatures(rollout: Rollout, facts: ReportFacts, rubrics: Sequence[Rubric]) -> dict[str, str]:
    """Per planned call (``kind\x1fkey``), what an identical request elsewhere in the group
    would share: the rubric and the report, or the claim and its pages' url and evidence."""
    located = report_of(rollout)
    if located is None:
        return {}
    report = located[1]
    pages = page_evidence(rollout)
    out: dict[str, str] = {}
    for kind, key in planned_calls(facts, rubrics):
        what: Any = [key, report] if kind == RUBRIC else citation_call(facts, pages, key)
        out[f"{kind}\x1f{key}"] = request_digest([kind, what])
    return out


def twin_calls(signatures: Mapping[str, Mapping[str, str]]) -> dict[str, list[str]]:
    """Per rollout, its calls that have an identical request in another rollout of the group."""
    seen: dict[str, set[str]] = {}
    for rollout_id, calls in signatures.items():
        for digest in calls.values():
            seen.setdefault(digest, set()).add(rollout_id)
    return {
        rollout_id: sorted(call for call, digest in calls.items() if len(seen[digest]) > 1)
        for rollout_id, calls in signatures.items()
    }


def answer_index(rollout: Rollout) -> int:
    found = report_of(rollout)
    return found[0] if found is not None else max(len(rollout.turns) - 1, 0)


def stored_outcomes(s: Session, group_pk: int) -> dict[str, dict[tuple[str, str], int | None]]:
    """Per rollout, (kind, key) -> score of each outcome judgment (None when it failed)."""
    out: dict[str, dict[tuple[str, str], int | None]] = {}
    rows = s.execute(
        select(m.Judgment.rollout_id, m.Judgment.kind, m.Judgment.rubric_id, m.Judgment.status, m.Judgment.level).where(
            m.Judgment.group_pk == group_pk, m.Judgment.kind.in_(OUTCOME_KINDS)
        )
    )
    for rollout_id, kind, key, status, level in rows:
        out.setdefault(rollout_id, {})[(kind, key)] = level if status == "ok" else None
    return out


def breakdown_of(
    facts: ReportFacts, rubrics: Sequence[Rubric], judged: Mapping[tuple[str, str], int | None], params: ScoringParams
) -> OutcomeBreakdown:
    """The reward of one rollout from its facts and its stored outcome judgments."""
    rubric_scores = {key: score for (kind, key), score in judged.items() if kind == RUBRIC}
    citation_scores: dict[tuple[int, str], int | None] = {}
    for (kind, key), score in judged.items():
        if kind == CITATION:
            claim, _, call = key.partition(":")
            citation_scores[(int(claim), call)] = score
    return outcome_breakdown(
        facts,
        rubrics,
        rubric_scores,
        citation_scores,
        params.outcome_weights.model_dump(),
        params.search_cap,
        params.length_cap,
        exclude=params.on_judge_failure == "exclude",
    )


def stored_facts(doc: Mapping[str, Any] | None) -> ReportFacts:
    """A rollout's report facts as ingest stored them; none stored reads as no report."""
    return ReportFacts.from_json(doc or {"has_report": False})


def group_breakdowns(
    s: Session, group_pk: int, rubrics: Sequence[Rubric], params: ScoringParams
) -> dict[str, OutcomeBreakdown]:
    """Every rollout's outcome breakdown (``outcome_source: judge`` groups)."""
    judged = stored_outcomes(s, group_pk)
    facts = s.execute(select(m.Rollout.rollout_id, m.Rollout.outcome_facts).where(m.Rollout.group_pk == group_pk)).all()
    return {
        rollout_id: breakdown_of(stored_facts(doc), rubrics, judged.get(rollout_id, {}), params)
        for rollout_id, doc in facts
    }


_WHY = {
    "failed": "left out: a citation call failed after its retries",
    "unscoreable": "scored 0 without a call: no letter or digit, or no reference resolves",
}


def breakdown_json(b: OutcomeBreakdown) -> dict[str, Any]:
    """The breakdown as the credits document shows it."""
    return {
        "reward": b.reward,
        "unscorable": b.unscorable,
        "components": {"rubric": b.rubric, "format": b.format, "search": b.search, "cite": b.cite, "length": b.length},
        "r_id": b.r_id,
        "r_semantic": b.r_semantic,
        "rubric_scores": dict(b.rubric_scores),
        "claims": [
            {
                "claim": c.claim,
                "references": list(c.references),
                "resolving": list(c.pages),
                "joint": c.joint,
                "individual": dict(c.individual),
                "score": c.score,
                "left_out": c.note == "failed",
                "why": _WHY.get(c.note or ""),
            }
            for c in b.claims
        ],
    }
