"""Which judge requests of a group could be identical to another (pure planning).

A visit request is identical to another only if everything but the history already
matches: same rubric and the same turn (reasoning, call, usable pages with their ids),
wherever the turn sits in its rollout; a snippet request only if its eligible results
match. Requests with no such
twin can never be de-duplicated, so the pipeline skips the lookup and the claim for
them and pays those database round trips only where they can save a judge call.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable

from drcredit.domain.credit import RolloutPlan
from drcredit.domain.group import Rollout, SearchResult, VisitTurn

#: A request signature from the parts that must match (lists of strings and None).
Digest = Callable[[object], str]


def json_digest(value: object) -> str:
    """The signature of ``value``: BLAKE2b of its compact UTF-8 JSON. The service hashes
    the same bytes made by orjson (``scoring.intake.content.request_digest``), which is ~30x
    faster; this is the reference it must equal."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def visit_signature(rollout: Rollout, turn_index: int, digest: Digest = json_digest) -> str:
    """The rubric-independent part of a visit request that must match for a twin."""
    turn = rollout.turns[turn_index]
    assert isinstance(turn, VisitTurn)
    return digest(
        [
            turn.reasoning,
            list(turn.call.urls),
            turn.call.goal,
            [[p.id, p.url, p.evidence, p.summary] for p in turn.usable_pages],
        ]
    )


def snippet_signature(eligible: Iterable[SearchResult], digest: Digest = json_digest) -> str:
    return digest([[r.id, r.snippet] for r in eligible])


def signatures(rollout: Rollout, plan: RolloutPlan, digest: Digest = json_digest) -> dict[str, list[int]]:
    """Signature -> the rollout's turn indices carrying it (visits and snippet tasks)."""
    out: dict[str, list[int]] = {}
    chain = plan.chains[0].turn_indices if plan.chains else ()
    for t in chain:
        out.setdefault("v" + visit_signature(rollout, t, digest), []).append(t)
    for task in plan.snippet_tasks:
        out.setdefault("s" + snippet_signature(task.eligible, digest), []).append(task.turn_index)
    return out


def twin_turns(per_rollout: dict[str, dict[str, list[int]]]) -> dict[str, set[int]]:
    """Rollout id -> turn indices whose request signature also occurs elsewhere in the group."""
    counts: Counter[str] = Counter()
    for sigs in per_rollout.values():
        for sig, turns in sigs.items():
            counts[sig] += len(turns)
    return {
        rollout_id: {t for sig, turns in sigs.items() if counts[sig] > 1 for t in turns}
        for rollout_id, sigs in per_rollout.items()
    }
