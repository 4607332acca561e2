"""What the judge is asked: the requests of each judgment kind and the prompt sent.

Shared by the judge loop (drcredit.judges.base) and the prompt builders
(drcredit.judges.prompts, drcredit.judges.outcome_prompts), which need nothing else of
each other.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from drcredit.domain.group import Rubric, SearchResult, VisitTurn

JudgeKind = Literal["visit", "snippet", "rubric", "citation"]


@dataclass(frozen=True)
class VisitJudgeRequest:
    """Everything the visit judge sees for one (visit, rubric) (docs/method.md, "Visit credit").

    No position in the rollout: the method does not give it to the judge, and without it the
    same visit with the same history is the same request wherever it occurs.
    """

    question: str
    rubric: Rubric
    prior_support: tuple[str, ...]
    turn: VisitTurn

    @property
    def usable_page_ids(self) -> list[str]:
        return [p.id for p in self.turn.usable_pages]


@dataclass(frozen=True)
class SnippetJudgeRequest:
    """Everything the snippet judge sees for one search turn (docs/method.md, "Search credit")."""

    question: str
    rubrics: tuple[Rubric, ...]
    results: tuple[SearchResult, ...]


@dataclass(frozen=True)
class RubricJudgeRequest:
    """One report against one rubric with a non-zero weight (docs/method.md, "Outcome reward")."""

    question: str
    rubric: Rubric
    report: str


@dataclass(frozen=True)
class CitationJudgeRequest:
    """One claim and the pages it cites: all of them (the joint call) or one."""

    claim: str
    #: (url, evidence) of each page, in order of first mention.
    pages: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Prompt:
    kind: JudgeKind
    system: str
    user: str
    schema_name: str
    schema: dict[str, Any]
    #: The layout the user message was rendered in (drcredit.judges.prompts.LAYOUTS).
    layout: str = "shared-first-v1"
    #: Characters at the start of ``user`` that the request's set of calls shares (a
    #: visit's rubric calls: question and visit), where routing keeps them together.
    shared_chars: int = 0

    @property
    def shared_prefix(self) -> str:
        return self.system + "\x00" + self.user[: self.shared_chars]

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]

    def digest(self, model: str, sampling: dict[str, Any]) -> str:
        """What makes two requests identical (docs/judges.md, "Reuse"):
        the model, the messages, the structured-output schema and every sampling parameter
        that reaches the server (``sampling``: temperature, the answer's token limit, the
        response format mode, the extra body with top_p, seed, ...). One key serves both
        the group's twins and the tenant's reuse store."""
        digest = hashlib.sha256()
        for part in (model, self.kind, self.system, self.user, self.schema_name):
            digest.update(part.encode())
            digest.update(b"\x00")
        digest.update(orjson.dumps(self.schema, option=orjson.OPT_SORT_KEYS))
        digest.update(b"\x00")
        digest.update(orjson.dumps(sampling, option=orjson.OPT_SORT_KEYS))
        return digest.hexdigest()
