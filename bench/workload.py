"""A seeded training step with realistic shapes (default 32 groups x 8 rollouts).

Per group: 5-8 rubrics (one penalty item in some groups), a pool of web pages of about
2,000 tokens each carrying fact tags ``{Fn}`` the simulated judge reads, rollouts of 4-18
research turns of which about half are visits (one or two pages, some failing), search
results drawn from the same pool so URLs repeat across rollouts of a group, and about
one rollout in seven stopped by the turn limit (no answer turn).
"""

from __future__ import annotations

import random
from typing import Any

WORDS = tuple(
    "grid storage battery thermal runaway module inspection report utility rule hearing emergency cell vent gas detection "
    "suppression spacing fire code standard test cabinet container operator commission docket permit county regulator "
    "incident timeline analysis failure cause evidence summary finding recommendation state".split(" ")
)


def _text(rng: random.Random, words: int, facts: list[int]) -> str:
    body = [rng.choice(WORDS) for _ in range(words)]
    for fact in facts:
        body.insert(rng.randrange(len(body)), f"{{F{fact}}}")
    return " ".join(body)


def make_group(seed: int, group_id: str, rollouts: int = 8, page_tokens: int = 2000) -> dict[str, Any]:
    rng = random.Random(seed)
    n_rubrics = rng.randint(5, 8)
    rubrics = [
        {
            "id": f"R{k + 1}",
            "type": "factual" if k % 3 else "logical",
            "description": f"criterion {k + 1} of the report",
            "weight": float(rng.choice((1, 2, 3))),
            "trusted_evidence": [f"reference fact {k + 1}"],
        }
        for k in range(n_rubrics)
    ]
    if rng.random() < 0.5:
        rubrics.append(
            {
                "id": "PEN",
                "type": "factual",
                "description": "asserts rumours as fact",
                "weight": -1.0,
                "trusted_evidence": [],
            }
        )
    pool = []
    for u in range(24):
        facts = rng.sample(range(seed * 100, seed * 100 + 60), rng.randint(1, 4))
        pool.append(
            {
                "url": f"https://source{u}.example.org/{seed}/article-{u}",
                "title": f"Article {u}",
                "snippet": _text(rng, 30, facts[:1] if rng.random() < 0.4 else []),
                "evidence": _text(rng, int(page_tokens * 0.75), facts),
                "summary": _text(rng, 40, facts[:1]),
            }
        )
    out = []
    for i in range(rollouts):
        turns: list[dict[str, Any]] = []
        n_results = n_pages = 0
        limit = rng.random() < 1 / 7
        research = 18 if limit else rng.randint(4, 17)
        for _ in range(research):
            if rng.random() < 0.5:
                picked = rng.sample(pool, rng.randint(1, 2))
                pages = []
                for doc in picked:
                    n_pages += 1
                    failed = rng.random() < 0.1
                    pages.append(
                        {
                            "id": f"W{n_pages}",
                            "url": doc["url"],
                            "evidence": "" if failed else doc["evidence"],
                            "summary": "" if failed else doc["summary"],
                            "error": "HTTP 403" if failed else None,
                        }
                    )
                turns.append(
                    {
                        "type": "visit",
                        "reasoning": "read the most promising source",
                        "call": {"urls": [d["url"] for d in picked], "goal": "find the facts"},
                        "pages": pages,
                    }
                )
            else:
                results = []
                for doc in rng.sample(pool, rng.randint(3, 5)):
                    n_results += 1
                    results.append(
                        {"id": f"S{n_results}", "url": doc["url"], "title": doc["title"], "snippet": doc["snippet"]}
                    )
                turns.append(
                    {
                        "type": "search",
                        "reasoning": "search for sources",
                        "call": {"queries": ["battery fire"]},
                        "results": results,
                    }
                )
        if not limit:
            turns.append({"type": "answer", "reasoning": "write it up", "answer": "the report"})
        out.append({"id": f"r{i}", "outcome_reward": round(rng.random(), 3), "turns": turns})
    return {"group_id": group_id, "question": f"What caused incident {seed}?", "rubrics": rubrics, "rollouts": out}


def make_step(groups: int = 32, rollouts: int = 8, seed: int = 0, page_tokens: int = 2000) -> list[dict[str, Any]]:
    return [make_group(seed * 1000 + g, f"s{seed}-g{g}", rollouts, page_tokens) for g in range(groups)]
