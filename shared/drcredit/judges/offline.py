"""A deterministic, network-free judge for local runs and tests.

It reads the very JSON document an LLM judge would receive and answers with a lexical
approximation of the same criteria: a page supports a rubric when its sentences share
the rubric's content words (from the description and trusted evidence), and support is
new when those words are not already in the rubric's history. It is a stand-in for
trying the platform, NOT a judge to train with: it cannot tell a paraphrase from a new
fact, nor a claim from its negation.
"""

from __future__ import annotations

import json
import re
from typing import Any

from drcredit.judges.base import AttemptPlan, Completion, Judge, Prompt, RetryPolicy
from drcredit.judges.prompts import DEFAULT_LAYOUT

_WORD = re.compile(r"[a-z0-9]+(?:[.,][0-9]+)*")
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]?")
_STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "been",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "for",
        "from",
        "had",
        "has",
        "have",
        "how",
        "in",
        "into",
        "is",
        "it",
        "its",
        "may",
        "might",
        "more",
        "most",
        "not",
        "of",
        "on",
        "or",
        "such",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "to",
        "under",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "why",
        "will",
        "with",
        "would",
        "about",
        "after",
        "also",
        "any",
        "between",
        "both",
        "during",
        "each",
        "other",
        "over",
        "same",
        "some",
        "should",
        "shall",
        "only",
        "very",
        "well",
        "per",
        "via",
        "whether",
    ]
)


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if (len(w) > 2 or w.isdigit()) and w not in _STOP}


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.findall(text) if s.strip()]


class OfflineJudge(Judge):
    backend = "offline"

    #: Share of the rubric's content words a sentence must newly cover for level 1 / 2.
    partial_share = 0.2
    high_share = 0.4

    def __init__(
        self, model: str = "offline-lexical-v1", retry: RetryPolicy | None = None, prompt_layout: str = DEFAULT_LAYOUT
    ):
        super().__init__(model, retry or RetryPolicy(max_attempts=1), prompt_layout=prompt_layout)

    async def acomplete(self, prompt: Prompt, plan: AttemptPlan) -> Completion:
        document = json.loads(prompt.user)
        if prompt.kind == "visit":
            answer = self._visit(document)
        elif prompt.kind == "snippet":
            answer = self._snippets(document)
        elif prompt.kind == "rubric":
            answer = self._rubric(document)
        else:
            answer = self._citation(document)
        text = json.dumps(answer)
        return Completion(
            text, prompt_tokens=len(prompt.user) // 4, completion_tokens=len(text) // 4, finish_reason="stop"
        )

    def _visit(self, doc: dict[str, Any]) -> dict[str, Any]:
        rubric = doc["rubric_item"]
        target = content_words(rubric["description"] + " " + " ".join(rubric["reference_facts"]))
        known = set().union(*(content_words(p) for p in doc["support_already_credited"]))
        if not target:
            return {"level": 0, "page_ids": [], "support_points": [], "rationale": "rubric has no content words"}
        scored: list[tuple[float, int, str, str]] = []
        for order, page in enumerate(doc["visit"]["pages"]):
            for sentence in sentences(page["evidence"]):
                new_hits = (content_words(sentence) & target) - known
                if len(new_hits) >= 2:
                    scored.append((len(new_hits) / len(target), -order, page["id"], sentence))
        if not scored:
            return {"level": 0, "page_ids": [], "support_points": [], "rationale": "no new overlap with the rubric"}
        scored.sort(key=lambda s: (-s[0], -s[1]))
        best = scored[0][0]
        level = 2 if best >= self.high_share else 1 if best >= self.partial_share else 0
        if level == 0:
            return {"level": 0, "page_ids": [], "support_points": [], "rationale": f"weak overlap ({best:.2f})"}
        chosen = scored[:3]
        page_ids = list(dict.fromkeys(s[2] for s in chosen))
        return {
            "level": level,
            "page_ids": page_ids,
            "support_points": [s[3][:300] for s in chosen],
            "rationale": f"new rubric-term coverage {best:.2f}",
        }

    def _rubric(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Share of the rubric's content words that one sentence of the report covers, on
        0-4: a lexical stand-in for satisfaction (it cannot tell a claim from its negation)."""
        target = content_words(doc["rubric_item"]["description"])
        if not target:
            return {"score": 0, "rationale": "rubric has no content words"}
        best = max((len(content_words(s) & target) / len(target) for s in sentences(doc["report"])), default=0.0)
        score = min(4, int(best * 5))
        return {"score": score, "rationale": f"best sentence covers {best:.2f} of the rubric's words"}

    def _citation(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Share of the claim's content words found in the cited evidence: all (2), some (1), none (0)."""
        claim = content_words(doc["claim"])
        if not claim:
            return {"score": 0, "rationale": "claim has no content words"}
        evidence = set().union(*(content_words(p["evidence"]) for p in doc["cited_pages"]))
        share = len(claim & evidence) / len(claim)
        score = 2 if share >= 0.8 else 1 if share >= 0.3 else 0
        return {"score": score, "rationale": f"{share:.2f} of the claim's words are in the pages"}

    def _snippets(self, doc: dict[str, Any]) -> dict[str, Any]:
        matches: list[dict[str, str]] = []
        used_quotes: set[str] = set()
        for rubric in doc["rubric_items"]:
            target = content_words(rubric["description"])
            if not target:
                continue
            best: tuple[int, str, str] | None = None
            for result in doc["unopened_results"]:
                for sentence in sentences(result["snippet"]):
                    hits = len(content_words(sentence) & target)
                    if (
                        hits >= max(3, len(target) // 2)
                        and sentence not in used_quotes
                        and (best is None or hits > best[0])
                    ):
                        best = (hits, result["id"], sentence)
            if best is not None:
                used_quotes.add(best[2])
                matches.append({"rubric_id": rubric["id"], "result_id": best[1], "evidence_quote": best[2]})
        return {"matches": matches}
