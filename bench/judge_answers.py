"""The simulated judge's answers, decided by the request content alone.

Pages and snippets carry fact tags like ``{F12}`` written by the workload generator, and
whether a fact supports a rubric, and how strongly, is a hash of (fact, rubric). A fact
already in the prior support earns nothing, so the simulated judge is history-aware like
the real one, and identical requests get identical answers.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

FACT = re.compile(r"\{F(\d+)\}")


def _h(*parts: str) -> int:
    return int.from_bytes(hashlib.blake2b("|".join(parts).encode(), digest_size=8).digest(), "big")


def fact_level(fact: str, rubric_id: str) -> int:
    """How strongly a fact supports a rubric: mostly 0, sometimes 1 or 2."""
    x = _h(fact, rubric_id) % 10
    return 2 if x == 0 else 1 if x in (1, 2) else 0


def visit_answer(doc: dict[str, Any]) -> dict[str, Any]:
    rubric = doc["rubric_item"]["id"]
    prior = set(doc["support_already_credited"])
    best, pages, points = 0, [], []
    for page in doc["visit"]["pages"]:
        for fact in FACT.findall(page["evidence"]):
            point = f"fact {fact} holds"
            level = fact_level(fact, rubric)
            if level and point not in prior and point not in points:
                best = max(best, level)
                pages.append(page["id"])
                points.append(point)
    if not best:
        return {"level": 0, "page_ids": [], "support_points": [], "rationale": "nothing new"}
    return {"level": best, "page_ids": list(dict.fromkeys(pages)), "support_points": points[:3], "rationale": "sim"}


def snippet_answer(doc: dict[str, Any]) -> dict[str, Any]:
    matches, used = [], set()
    for rubric in doc["rubric_items"]:
        for result in doc["unopened_results"]:
            for m in FACT.finditer(result["snippet"]):
                if fact_level(m.group(1), rubric["id"]) == 2 and m.group(0) not in used:
                    used.add(m.group(0))
                    matches.append({"rubric_id": rubric["id"], "result_id": result["id"], "evidence_quote": m.group(0)})
                    break
            else:
                continue
            break
    return {"matches": matches}


def rubric_answer(doc: dict[str, Any]) -> dict[str, Any]:
    """Rubric satisfaction of a report: a hash of (report facts, rubric), 0-4."""
    facts = FACT.findall(doc["report"])
    best = max((fact_level(f, doc["rubric_item"]["id"]) for f in facts), default=0)
    return {"score": min(4, 2 * best), "rationale": "sim"}


def citation_answer(doc: dict[str, Any]) -> dict[str, Any]:
    """Support of a claim: its facts found in the cited pages' evidence (all 2, some 1, none 0)."""
    claimed = set(FACT.findall(doc["claim"]))
    found = {f for p in doc["cited_pages"] for f in FACT.findall(p["evidence"])}
    score = 0 if not claimed or not claimed & found else 2 if claimed <= found else 1
    return {"score": score, "rationale": "sim"}


ANSWERS = {"visit": visit_answer, "snippet": snippet_answer, "rubric": rubric_answer, "citation": citation_answer}


def kind_of(doc: dict[str, Any]) -> str:
    if "visit" in doc:
        return "visit"
    if "report" in doc:
        return "rubric"
    return "citation" if "claim" in doc else "snippet"
