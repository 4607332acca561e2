"""What ``drcredit audit`` prints: an audit's report as tables readable at 80 columns, and
the list of a tenant's audits. The figures are the document's (docs/audit.md says what
each means); ``--json`` prints the document itself."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from drcredit_cli import consoles

#: The kinds compared, as the report names them, with their categories.
KINDS = (
    ("visit", "visit level (0-2)"),
    ("snippet", "snippet match (0/1)"),
    ("report_rubric", "report rubric (0-4)"),
    ("citation", "citation joint (0-2)"),
)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.3f}"


def table_lines(table: Table, out: Console) -> list[str]:
    """``table``'s rows as plain lines, at their natural widths."""
    with out.capture() as captured:
        out.print(table, width=10_000, crop=False)
    return captured.get().splitlines()


def _table() -> Table:
    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)


def scope_text(audit: dict[str, Any]) -> str:
    """The audit's scope in words: ``run exp``, ``batch b1`` or ``groups g0, g1``."""
    scope = audit.get("scope") or {}
    if "run" in scope:
        return f"run {scope['run']}"
    if "batch_id" in scope:
        return f"batch {scope['batch_id']}"
    ids = list(scope.get("group_ids") or [])
    shown = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
    return f"groups {shown}"


def judge_text(audit: dict[str, Any]) -> str:
    model = audit.get("judge_model")
    return f"{audit['judge']} ({model})" if model else str(audit["judge"])


def headline(audit: dict[str, Any]) -> str:
    """One line: which judge re-scored what, how many groups, with which seed."""
    sampled = len(audit.get("group_ids") or [])
    if audit["judge"] == "human":
        return (
            f"audit {audit['audit_id']} {audit['status']}: the original judge against people's labels, "
            f"{scope_text(audit)}, {sampled} labeled group{'s' if sampled != 1 else ''}"
        )
    return (
        f"audit {audit['audit_id']} {audit['status']}: audit judge {judge_text(audit)}, {scope_text(audit)}, "
        f"{sampled} group{'s' if sampled != 1 else ''} sampled (seed {audit['seed']})"
    )


def agreement_table(agreement: dict[str, Any]) -> Table:
    table = _table()
    table.add_column("kind")
    for header in ("pairs", "left out", "exact", "kappa", "bias"):
        table.add_column(header, justify="right", no_wrap=True)
    for kind, label in KINDS:
        a = agreement.get(kind)
        if a is None:
            continue
        rows = [(label, a)] + ([("  first visits", a["first_visit"])] if a.get("first_visit") is not None else [])
        for name, f in rows:
            table.add_row(
                name,
                f"{f['pairs']:,}",
                f"{f['left_out']:,}",
                _pct(f["exact"]),
                _num(f["kappa"], 3),
                _signed(f.get("bias")),
            )
    return table


def marginals_table(agreement: dict[str, Any], audit_side: str = "audit") -> Table | None:
    """Each side's share of its pairs per value, per kind with pairs (None: no kind has)."""
    table = _table()
    table.add_column("kind")
    table.add_column("side")
    for value in range(5):
        table.add_column(str(value), justify="right", no_wrap=True)
    rows = 0
    for kind, _ in KINDS:
        marginals = (agreement.get(kind) or {}).get("marginals")
        if not marginals:
            continue
        for side, name in (("original", "original"), ("audit", audit_side)):
            shares = list(marginals[side])
            table.add_row(
                kind if side == "original" else "", name, *(_pct(x) for x in shares), *[""] * (5 - len(shares))
            )
            rows += 1
    return table if rows else None


def labelers_table(labelers: dict[str, Any]) -> Table:
    """Each pair of labelers (the first by name as the original), per kind with pairs."""
    table = _table()
    for header in ("labelers", "kind"):
        table.add_column(header, overflow="fold")
    for header in ("pairs", "exact", "kappa", "bias"):
        table.add_column(header, justify="right", no_wrap=True)
    for pair in labelers.get("pairs") or []:
        names = f"{pair['original']} / {pair['audit']}"
        for kind, label in KINDS:
            f = pair["agreement"].get(kind) or {}
            if not f.get("pairs"):
                continue
            table.add_row(names, label, f"{f['pairs']:,}", _pct(f["exact"]), _num(f["kappa"], 3), _signed(f["bias"]))
            names = ""
    return table


def confusion_tables(agreement: dict[str, Any], audit_side: str = "audit") -> list[tuple[str, Table]]:
    """(title, table) per kind with pairs: rows the original judge's value, columns the
    audit side's (the audit judge's, or people's: ``audit_side`` names it in the header)."""
    out = []
    for kind, label in KINDS:
        a = agreement.get(kind)
        if not a:
            continue
        rows = [(label, a)] + ([("visit level, first visits", a["first_visit"])] if a.get("first_visit") else [])
        for name, figures in rows:
            if not figures["pairs"]:
                continue
            matrix = figures["confusion"]
            table = _table()
            table.add_column(f"original \\ {audit_side}", justify="right")
            for j in range(len(matrix)):
                table.add_column(str(j), justify="right", no_wrap=True)
            for i, row in enumerate(matrix):
                table.add_row(str(i), *(f"{n:,}" for n in row))
            out.append((name, table))
    return out


def effect_table(effect: dict[str, Any]) -> Table:
    table = _table()
    table.add_column("measure")
    table.add_column("process A_rg", justify="right", no_wrap=True)
    table.add_column("fused", justify="right", no_wrap=True)
    table.add_row("W1", _num(effect["w1"]), _num(effect["fused_w1"]))
    table.add_row("RMSE", _num(effect["rmse"]), _num(effect["fused_rmse"]))
    table.add_row("sign agreement", _pct(effect["process_sign_agreement"]), _pct(effect["fused_sign_agreement"]))
    return table


def usage_text(usage: dict[str, Any]) -> str:
    seconds = usage.get("seconds")
    return (
        f"audit judge usage: {usage['calls']:,} calls for {usage.get('judgments', 0):,} judgments, "
        f"{usage['prompt_tokens']:,} prompt tokens ({usage.get('cached_prompt_tokens', 0):,} cached), "
        f"{usage['completion_tokens']:,} completion tokens" + ("" if seconds is None else f", {seconds:.1f} s")
    )


def print_audit(doc: dict[str, Any], out: Console | None = None) -> None:
    """A done audit's report."""
    out = out or consoles.out
    human = doc["judge"] == "human"
    other = "people" if human else "the audit judge"
    out.print(headline(doc), highlight=False)
    out.print()
    out.print(
        "[bold]Agreement[/] (pairs: "
        + ("judgments people labeled" if human else "judgments both judges made")
        + f"; kappa: quadratic-weighted; bias: mean of {other} minus the original)",
        highlight=False,
    )
    out.print(agreement_table(doc["agreement"]))
    side = "people" if human else "audit"
    marginals = marginals_table(doc["agreement"], side)
    if marginals is not None:
        out.print()
        out.print("[bold]Marginals[/] (each side's share of its pairs per value)", highlight=False)
        out.print(marginals)
    matrices = confusion_tables(doc["agreement"], side)
    if matrices:
        out.print()
        out.print(f"[bold]Confusion matrices[/] (rows: the original judge; columns: {other})", highlight=False)
    for title, table in matrices:
        out.print()
        out.print(title, highlight=False)
        out.print(table)
    out.print()
    if human:
        _print_people(doc, out)
        return
    effect = doc["effect"]
    out.print(f"[bold]Effect on the advantages[/] over {effect['turns']:,} non-final turns", highlight=False)
    out.print(effect_table(effect))
    outcome = effect.get("outcome_rmse")
    out.print(
        "outcome reward RMSE: "
        + ("n/a (no group of the sample has its outcome judged by the service)" if outcome is None else _num(outcome)),
        highlight=False,
    )
    out.print(usage_text(doc["usage"]), highlight=False)


def _print_people(doc: dict[str, Any], out: Console) -> None:
    labelers = doc.get("labelers") or {}
    counts = ", ".join(f"{name} {n:,}" for name, n in (labelers.get("labels") or {}).items())
    out.print(f"labels by: {counts or 'nobody'}", highlight=False)
    if labelers.get("pairs"):
        out.print()
        out.print("[bold]Labelers against each other[/] (on the keys both labeled)", highlight=False)
        out.print(labelers_table(labelers))
    out.print(
        "no effect on the advantages: people's labels give no second set of advantages; "
        f"{doc['usage'].get('labels', 0):,} labels, no judge call",
        highlight=False,
    )


def print_audits(audits: list[dict[str, Any]], out: Console | None = None) -> None:
    """A tenant's audits, newest first; a done one's headline figures, a failed one's reason."""
    out = out or consoles.out
    if not audits:
        out.print("no audit yet: drcredit audit start --judge NAME --run RUN (or --batch, --group)", highlight=False)
        return
    # Two lines an audit, so that 80 columns hold it whole: the id, the status and the
    # figures, aligned; then who judged what (a table folded the judge and scope into
    # columns a few letters wide).
    table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
    for _ in range(5):
        table.add_column(no_wrap=True)
    for a in audits:
        visit = (a.get("agreement") or {}).get("visit") or {}
        effect = a.get("effect") or {}
        table.add_row(
            a["audit_id"],
            a["status"],
            f"kappa {_num(visit.get('kappa'), 3)}",
            f"sign {_pct(effect.get('fused_sign_agreement'))}",
            (a.get("created_at") or "")[:16].replace("T", " ") + " UTC",
        )
    lines = table_lines(table, out)
    for a, line in zip(audits, lines, strict=True):
        sampled = len(a.get("group_ids") or [])
        out.print(line.rstrip(), highlight=False, soft_wrap=True)
        out.print(
            f"    {judge_text(a)} on {scope_text(a)} ({sampled} group{'s' if sampled != 1 else ''})",
            highlight=False,
        )
    for a in audits:
        if a["status"] == "failed":
            out.print(f"{a['audit_id']} failed: {a.get('error')}", highlight=False)
