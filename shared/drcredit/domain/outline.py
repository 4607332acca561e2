"""A rollout's outline: its turns with every text taken out, for the credit math.

Credits and advantages (docs/method.md, "Visit credit" to "Advantages") depend on a rollout's shape, not its text:
the turn types, the URLs searched and called, the result and page ids, errors, and
whether each page is usable. The judgments carry everything the text contributed. An
outline keeps exactly that shape, so aggregation and replay read a few hundred bytes
per turn instead of its pages (tens of megabytes per training step), and give the same
credits as the full rollout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from drcredit.domain.group import page_usable

#: The evidence an outline gives a usable page: non-blank, so that the page stays
#: usable (docs/method.md, "Visit credit"), and clearly not page text.
USABLE_EVIDENCE = "[usable page]"


def outline_turns(turns: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The outline of a rollout's turns, given as their JSON form (``model_dump(mode="json")``)."""
    return [_outline_turn(turn) for turn in turns]


def _outline_turn(turn: Mapping[str, Any]) -> dict[str, Any]:
    kind = turn["type"]
    if kind == "search":
        return {
            "type": "search",
            "results": [{"id": r["id"], "url": r["url"]} for r in turn.get("results") or ()],
            "error": turn.get("error"),
        }
    if kind == "visit":
        return {
            "type": "visit",
            "call": {"urls": list((turn.get("call") or {}).get("urls") or ())},
            "pages": [
                {
                    "id": p["id"],
                    "url": p.get("url") or "",
                    "evidence": USABLE_EVIDENCE if page_usable(p.get("error"), p.get("evidence")) else None,
                    "error": p.get("error"),
                }
                for p in turn.get("pages") or ()
            ],
        }
    return {"type": kind}
