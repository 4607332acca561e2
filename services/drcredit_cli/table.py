"""The advantages table ``drcredit score`` prints: one row per turn, readable at 80 columns.

The outcome advantage ``A_o`` has its own column, on a rollout's first row, so the rollout
label stays one short line; a long rollout id folds inside its column rather than pushing
the numbers onto a second line. Full names and values are in ``--json``.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, JustifyMethod
from rich.table import Table

from drcredit_cli import consoles

#: (header, justification) of the columns after the rollout's; the last says when a turn is
#: unscorable.
NUMBERS: tuple[tuple[str, JustifyMethod], ...] = (
    ("A_o", "right"),
    ("turn", "right"),
    ("type", "left"),
    ("credit", "right"),
    ("A_rg", "right"),
    ("D", "right"),
    ("advantage", "right"),
    ("note", "left"),
)

LEGEND = (
    "A_o outcome advantage; A_rg process advantage (normalized credit); D discounted A_rg; "
    "advantage = A_o + process_weight x D, the value to train on; "
    "unscorable: the credit depends on a failed judgment"
)


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:+.4f}"


def advantages_table(document: dict[str, Any]) -> Table:
    table = Table(
        title=f"Advantages of group {document['group_id']}",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("rollout", overflow="fold")
    for header, justify in NUMBERS:
        table.add_column(header, justify=justify, no_wrap=True)
    for rollout in document["rollouts"]:
        for k, turn in enumerate(rollout["turns"]):
            first = k == 0
            table.add_row(
                rollout["id"] if first else "",
                _fmt(rollout["outcome_advantage"]) if first else "",
                str(turn["index"]),
                turn["type"],
                "" if turn["credit"] is None else f"{turn['credit']:.3f}",
                _fmt(turn["process_advantage"]),
                _fmt(turn["discounted_process_advantage"]),
                _fmt(turn["advantage"]),
                "unscorable" if turn["unscorable"] else "",
            )
        table.add_section()
    return table


def print_advantages(
    document: dict[str, Any], progress: dict[str, int], out: Console | None = None, judge: str | None = None
) -> None:
    """The table, the group's statistics and its judge-call counts (``judge``: the
    backend that scored, said when it is the offline one, which is no model at all)."""
    out = out or consoles.out
    stats = document["stats"]
    out.print(advantages_table(document))
    out.print(LEGEND, style="dim", highlight=False)
    sigma_o = stats["sigma_o"]
    out.print(
        f"mu_rg={stats['mu_rg']:.4f} sigma_rg={stats['sigma_rg']:.4f} "
        f"mu_o={'n/a' if stats['mu_o'] is None else format(stats['mu_o'], '.4f')} "
        f"sigma_o={'n/a' if sigma_o is None else format(sigma_o, '.4f')}  |  "
        f"judge calls {progress['judge_calls']}, cache hits {progress['cache_hits']}, "
        f"deterministic zeros {progress['deterministic_zeros']}, skipped snippet calls {progress['snippet_calls_skipped']}, "
        f"failed {progress['judgments_failed']}",
        highlight=False,
    )
    usage = document.get("usage")
    if usage is not None:
        out.print(usage_line(usage), highlight=False)
    if judge == "offline":
        out.print(
            "judge: offline, a lexical stand-in for trying the platform; do not train on it "
            "(DRCREDIT_JUDGE=openai asks a real judge)",
            style="dim",
            highlight=False,
        )


def usage_line(usage: dict[str, Any]) -> str:
    """The judge's usage in one line: calls, tokens (cached and estimated parts), cost."""
    cost = usage["cost_usd"]
    estimated = usage.get("estimated_prompt_tokens", 0)
    return (
        f"judge usage: {usage['calls']} calls for {usage.get('judgments', 0)} judgments, "
        f"{usage['prompt_tokens']} prompt tokens ({usage['cached_prompt_tokens']} cached"
        + (f", {estimated} estimated" if estimated else "")
        + f"), {usage['completion_tokens']} completion tokens, "
        + ("cost n/a (set DRCREDIT_JUDGE_PRICE)" if cost is None else f"cost ${cost:.6f}")
    )
