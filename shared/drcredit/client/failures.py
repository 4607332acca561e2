"""What an advantages document says about failed judgments (docs/method.md, "Judge failures").

A trainer reads failures where it reads the numbers: every turn carries ``unscorable``
and every group its judgment counts (``progress``). ``wait_for_advantages`` and
``wait_for_batch`` warn with :class:`JudgmentsFailed` when a document holds failures, so
a run never learns from a guess without being told.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

JSONDict = dict[str, Any]


class JudgmentsFailed(UserWarning):
    """Some judgments of a finished group failed; their turns are flagged ``unscorable``."""


def group_documents(document: JSONDict) -> Iterator[JSONDict]:
    """The group documents of a group's or a batch's advantages document."""
    if "groups" in document:
        yield from (g for g in document["groups"] if isinstance(g, dict) and "rollouts" in g)
    elif "rollouts" in document:
        yield document


def failed_judgments(document: JSONDict) -> int:
    """Failed judgments over the group (or every group of the batch)."""
    return sum(int((g.get("progress") or {}).get("judgments_failed", 0)) for g in group_documents(document))


def unscorable_turns(document: JSONDict) -> list[tuple[str, str, int]]:
    """(group id, rollout id, turn index) of every turn whose credit depends on a failed judgment."""
    return [
        (str(g.get("group_id")), str(r["id"]), int(t["index"]))
        for g in group_documents(document)
        for r in g.get("rollouts", [])
        for t in r.get("turns", [])
        if t.get("unscorable")
    ]


def warn_on_failures(document: JSONDict) -> None:
    failed = failed_judgments(document)
    if failed:
        turns = unscorable_turns(document)
        groups = sorted({g for g, _, _ in turns})
        warnings.warn(
            JudgmentsFailed(
                f"{failed} judgment(s) failed; {len(turns)} turn(s) flagged unscorable in group(s) "
                f"{', '.join(groups[:5])}{' ...' if len(groups) > 5 else ''} (policy: each group's "
                "params.on_judge_failure; 'exclude' keeps them out of the normalization)"
            ),
            stacklevel=3,
        )
