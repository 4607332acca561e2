"""A seeded training step with realistic shapes (default 32 groups x 8 rollouts).

Per group: 5-8 rubrics (a penalty item in about half the groups) and a pool of web pages
of about 1,500 tokens each (``page_tokens``, counted as the simulated judge counts them:
characters / 4; extracted page text is cut near 2,048 tokens) carrying fact tags ``{Fn}``
the simulated judge reads. A
rollout has 4-18 research turns, about half of them visits; about one rollout in seven
stops at the turn limit (18 research turns, no answer turn).

The shapes follow the paper's tool setup (its appendix on tools) and how a research
agent behaves:

- A search sends one or two queries and gets up to three results per query. Queries
  come from a small per-question set, so rollouts of a group often send the same query,
  and the same query always returns the same results: URLs repeat across rollouts.
- A visit opens one or two URLs, nearly always results the rollout has seen in its own
  searches and not opened yet (most recent search first); now and then a URL it never
  saw (a source it knows of). A rollout therefore starts with a search.
- One page in ten fails (an HTTP error, no evidence).
- Every turn's reasoning and visit goal are the rollout's own text: sampled rollouts
  do not repeat each other word for word.
"""

from __future__ import annotations

import random
from typing import Any

WORDS = tuple(
    "grid storage battery thermal runaway module inspection report utility rule hearing emergency cell vent gas detection "
    "suppression spacing fire code standard test cabinet container operator commission docket permit county regulator "
    "incident timeline analysis failure cause evidence summary finding recommendation state".split(" ")
)

#: Pages a question's searches can return.
POOL_SIZE = 24
#: Distinct queries a question's rollouts choose from.
QUERIES_PER_QUESTION = 10
RESULTS_PER_QUERY = 3
PAGE_FAILURE_RATE = 0.1
#: Chance that a turn after the first is a visit, when the rollout has results to open
#: (the first turn is a search): about half the research turns end up visits.
VISIT_RATE = 0.55
#: Share of visits that open a URL the rollout never saw in its search results.
UNSEEN_VISIT_RATE = 0.1
TURN_LIMIT = 18


#: Characters a word of the page text takes on average, its space included: the words a
#: page needs for its tokens.
_WORD_CHARS = sum(len(w) for w in WORDS) / len(WORDS) + 1


def page_words(tokens: int) -> int:
    """Words of about ``tokens`` tokens at 4 characters a token."""
    return max(1, round(tokens * 4 / _WORD_CHARS))


def _text(rng: random.Random, words: int, facts: list[int] | None = None) -> str:
    body = [rng.choice(WORDS) for _ in range(words)]
    for fact in facts or ():
        body.insert(rng.randrange(len(body)), f"{{F{fact}}}")
    return " ".join(body)


def _rubrics(rng: random.Random) -> list[dict[str, Any]]:
    rubrics = [
        {
            "id": f"R{k + 1}",
            "type": "factual" if k % 3 else "logical",
            "description": f"criterion {k + 1} of the report",
            "weight": float(rng.choice((1, 2, 3))),
            "trusted_evidence": [f"reference fact {k + 1}"],
        }
        for k in range(rng.randint(5, 8))
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
    return rubrics


def make_group(
    seed: int,
    group_id: str,
    rollouts: int = 8,
    page_tokens: int = 1500,
    page_failure_rate: float = PAGE_FAILURE_RATE,
) -> dict[str, Any]:
    rng = random.Random(seed)
    rubrics = _rubrics(rng)
    pool = []
    for u in range(POOL_SIZE):
        facts = rng.sample(range(seed * 100, seed * 100 + 60), rng.randint(1, 4))
        pool.append(
            {
                "url": f"https://source{u}.example.org/{seed}/article-{u}",
                "title": f"Article {u}",
                "snippet": _text(rng, 30, facts[:1] if rng.random() < 0.4 else []),
                "evidence": _text(rng, page_words(page_tokens), facts),
                "summary": _text(rng, 40, facts[:1]),
            }
        )
    # A search engine answers the same query with the same pages.
    queries = [
        (f"{_text(rng, 3)} incident {seed}", rng.sample(range(POOL_SIZE), RESULTS_PER_QUERY))
        for _ in range(QUERIES_PER_QUESTION)
    ]
    out = [_rollout(rng, f"r{i}", pool, queries, page_failure_rate) for i in range(rollouts)]
    return {"group_id": group_id, "question": f"What caused incident {seed}?", "rubrics": rubrics, "rollouts": out}


def _rollout(
    rng: random.Random,
    rollout_id: str,
    pool: list[dict[str, Any]],
    queries: list[tuple[str, list[int]]],
    page_failure_rate: float,
) -> dict[str, Any]:
    limit = rng.random() < 1 / 7
    research = TURN_LIMIT if limit else rng.randint(4, TURN_LIMIT - 1)
    turns: list[dict[str, Any]] = []
    n_results = n_pages = 0
    searched: list[list[int]] = []  # pool pages each search returned, in result order
    opened: set[int] = set()
    for k in range(research):
        # What the agent may open next: the latest search's results first, top result first.
        unopened = list(dict.fromkeys(u for found in reversed(searched) for u in found if u not in opened))
        if k > 0 and unopened and rng.random() < VISIT_RATE:
            seen = {u for found in searched for u in found}
            picked: list[int] = []
            for _ in range(rng.randint(1, 2)):
                candidates = [u for u in unopened if u not in picked]
                if candidates and rng.random() >= UNSEEN_VISIT_RATE:
                    picked.append(candidates[min(int(rng.expovariate(0.7)), len(candidates) - 1)])
                else:
                    picked.append(rng.choice([u for u in range(len(pool)) if u not in seen and u not in picked]))
            opened.update(picked)
            pages = []
            for u in picked:
                n_pages += 1
                doc = pool[u]
                failed = rng.random() < page_failure_rate
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
                    "reasoning": f"{rollout_id} turn {k}: {_text(rng, 25)}",
                    "call": {"urls": [pool[u]["url"] for u in picked], "goal": _text(rng, 8)},
                    "pages": pages,
                }
            )
            continue
        asked = rng.sample(queries, rng.randint(1, 2))
        results = []
        returned: list[int] = []
        for _, pages_of_query in asked:
            for u in pages_of_query:
                if u in returned:
                    continue
                returned.append(u)
                n_results += 1
                doc = pool[u]
                results.append(
                    {"id": f"S{n_results}", "url": doc["url"], "title": doc["title"], "snippet": doc["snippet"]}
                )
        searched.append(returned)
        turns.append(
            {
                "type": "search",
                "reasoning": f"{rollout_id} turn {k}: {_text(rng, 25)}",
                "call": {"queries": [q for q, _ in asked]},
                "results": results,
            }
        )
    if not limit:
        turns.append({"type": "answer", "reasoning": _text(rng, 25), "answer": _text(rng, 200)})
    return {"id": rollout_id, "outcome_reward": round(rng.random(), 3), "turns": turns}


def make_step(
    groups: int = 32,
    rollouts: int = 8,
    seed: int = 0,
    page_tokens: int = 1500,
    page_failure_rate: float = PAGE_FAILURE_RATE,
) -> list[dict[str, Any]]:
    return [
        make_group(seed * 1000 + g, f"s{seed}-g{g}", rollouts, page_tokens, page_failure_rate) for g in range(groups)
    ]


def with_judged_outcomes(group: dict[str, Any]) -> dict[str, Any]:
    """The group with the service judging its outcome rewards (docs/method.md, "Outcome reward").

    No trainer reward; each report gets two headings and cites up to three of the
    rollout's usable pages, one claim per page, each claim the first sentence of its page
    (so it carries that page's fact tags), the last claim citing two pages.
    """
    out = {**group, "params": {**(group.get("params") or {}), "outcome_source": "judge"}}
    rollouts = []
    for rollout in group["rollouts"]:
        turns = list(rollout["turns"])
        if turns and turns[-1]["type"] == "answer":
            pages = [
                p
                for t in turns
                if t["type"] == "visit"
                for p in t["pages"]
                if not p.get("error") and (p.get("evidence") or "").strip()
            ][:3]
            claims = []
            for k, page in enumerate(pages):
                refs = page["id"] if k < len(pages) - 1 or len(pages) < 2 else f"{page['id']}, {pages[0]['id']}"
                first = page["evidence"].split(". ")[0]
                claims.append(f'<cite id="{refs}">{first}</cite>')
            report = "# Findings\n\n" + turns[-1]["answer"] + "\n\n## Sources\n\n" + "\n".join(claims)
            turns[-1] = {**turns[-1], "answer": report}
        rollouts.append({k: v for k, v in rollout.items() if k != "outcome_reward"} | {"turns": turns})
    out["rollouts"] = rollouts
    return out
