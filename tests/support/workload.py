"""Seeded groups for the marker judge: varied shapes, repeated URLs, failed pages."""

from __future__ import annotations

import random
from typing import Any

from tests.support.builders import answer, group_doc, page, rollout, rubric, search, visit


def marker_group(seed: int, group_id: str, rollouts: int = 4, max_turns: int = 6) -> dict[str, Any]:
    rnd = random.Random(seed)
    rubrics = [rubric("R1", weight=2.0), rubric("R2"), rubric("R3", kind="logical"), rubric("P", weight=-1.0)]
    urls = [f"https://site{k}.org/page{k}" for k in range(6)]
    facts = [f"fact{k}" for k in range(5)]
    out = []
    for i in range(rollouts):
        turns: list[dict[str, Any]] = []
        n_results = 0
        n_pages = 0
        for _ in range(rnd.randint(1, max_turns)):
            if rnd.random() < 0.45:
                results = []
                for _ in range(rnd.randint(1, 3)):
                    n_results += 1
                    marks = " ".join(f"[{r}]" for r in ("R1", "R2", "R3") if rnd.random() < 0.25)
                    results.append((f"S{n_results}", rnd.choice(urls), f"snippet {marks} text"))
                turns.append(search(*results))
            else:
                pages = []
                for _ in range(rnd.randint(1, 2)):
                    n_pages += 1
                    marks = " ".join(
                        f"[{r}:{rnd.choice((1, 2))}:{rnd.choice(facts)}]"
                        for r in ("R1", "R2", "R3")
                        if rnd.random() < 0.5
                    )
                    failed = rnd.random() < 0.15
                    pages.append(
                        page(
                            f"W{n_pages}",
                            rnd.choice(urls),
                            "" if failed else f"evidence {marks}",
                            error="403" if failed else None,
                        )
                    )
                turns.append(visit(*pages))
        if rnd.random() < 0.8:
            turns.append(answer())
        out.append(rollout(f"r{i}", *turns, reward=round(rnd.random(), 3)))
    return group_doc(*out, rubrics=rubrics, group_id=group_id)
