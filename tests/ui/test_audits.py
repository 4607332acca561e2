"""The run page's judge audits in the browser: each audit of the run, newest first, with
the figures of its document (``GET /v1/audits/{id}``) per kind, its confusion matrices
laid out side by side without overlap, the effect on the advantages, per group and its
usage; a running audit's status, a failed one's reason; how to start one when there is
none; and the same in ``drcredit report run``, from the database and from the service."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.ui.conftest import AUDITS
from tests.ui.helpers import K1, K2, Service, api, boxes, open_page, overlapping, ready, shot
from tests.ui.helpers import fixed as to_fixed

KINDS = {
    "visit": "visit levels",
    "snippet": "snippet matches",
    "report_rubric": "report rubric scores",
    "citation": "citation joint scores",
}


def pct(x: float | None) -> str:
    return "–" if x is None else f"{to_fixed(100 * x, 1)}%"


def fixed(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else to_fixed(x, digits)


def value_of(cell: Locator) -> float | None:
    raw = cell.get_attribute("data-value")
    return None if raw is None else float(raw)


def signed(x: float | None) -> str:
    """A mean difference as the page writes it: its sign always, a true minus sign."""
    if x is None:
        return "–"
    text = to_fixed(abs(x), 3)
    return ("−" if x < 0 and float(text) != 0 else "+") + text


def check_marginals(article: Locator, kind: str, figures: dict[str, Any]) -> None:
    """Each side's shares per value, one row per side, as the document's marginals."""
    rows = article.locator(f'.audit-marginals tr[data-kind="{kind}"]')
    if kind == "first_visit" or not figures["pairs"]:
        expect(rows).to_have_count(0)
        return
    expect(rows).to_have_count(2)
    for k, side in enumerate(("original", "audit")):
        shares = figures["marginals"][side]
        texts = rows.nth(k).locator("td").all_inner_texts()
        assert texts[1 : 1 + len(shares)] == [pct(x) for x in shares], (kind, side)
        values = [value_of(rows.nth(k).locator("td").nth(1 + j)) for j in range(len(shares))]
        assert values == shares, (kind, side)


def check_agreement(article: Locator, doc: dict[str, Any]) -> None:
    """The agreement table and the confusion matrices show the document's figures."""
    rows = {"first_visit": doc["agreement"]["visit"]["first_visit"], **doc["agreement"]}
    for kind, figures in rows.items():
        row = article.locator(f'.audit-agreement tr[data-kind="{kind}"]')
        cells = row.locator("td")
        assert cells.all_inner_texts() == [
            str(figures["pairs"]),
            str(figures["left_out"]),
            pct(figures["exact"]),
            fixed(figures["kappa"]),
            signed(figures["bias"]),
        ], kind
        assert value_of(cells.nth(2)) == figures["exact"] and value_of(cells.nth(3)) == figures["kappa"], kind
        assert value_of(cells.nth(4)) == figures["bias"], kind
        check_marginals(article, kind, figures)
        matrix = article.locator(f'.matrix[data-kind="{kind}"]')
        if not figures["pairs"]:
            expect(matrix).to_have_count(0)
            continue
        confusion = figures["confusion"]
        # Rows the original judge's value, columns the audit judge's, each labelled 0..m.
        assert matrix.locator("thead th").all_inner_texts()[1:] == [str(j) for j in range(len(confusion))]
        body = matrix.locator("tbody tr")
        expect(body).to_have_count(len(confusion))
        for i, counts in enumerate(confusion):
            assert body.nth(i).locator("th").inner_text() == str(i)
            assert [int(t) for t in body.nth(i).locator("td").all_inner_texts()] == counts, (kind, i)
        # The counts add up to the pairs and their diagonal to the exact agreement.
        assert sum(map(sum, confusion)) == figures["pairs"]
        assert sum(confusion[i][i] for i in range(len(confusion))) / figures["pairs"] == pytest.approx(figures["exact"])
        title = matrix.locator("td").first.get_attribute("title") or ""
        assert title.startswith(f"{KINDS.get(kind, 'visit levels, first visits')}: original ")


def check_effect(article: Locator, doc: dict[str, Any]) -> None:
    e = doc["effect"]
    for name, (w1, rmse, sign) in {
        "process": (e["w1"], e["rmse"], e["process_sign_agreement"]),
        "fused": (e["fused_w1"], e["fused_rmse"], e["fused_sign_agreement"]),
    }.items():
        cells = article.locator(f'.audit-effect tr[data-advantage="{name}"] td')
        assert cells.all_inner_texts() == [fixed(w1), fixed(rmse), pct(sign)], name
        assert [value_of(cells.nth(k)) for k in range(3)] == [w1, rmse, sign], name
    expect(article.locator("h4").filter(has_text="Effect on the advantages")).to_contain_text(
        f"{e['turns']} non-final turns"
    )
    expect(article.locator(".audit-outcome")).to_contain_text(f"Outcome reward RMSE: {fixed(e['outcome_rmse'])}")
    groups = article.locator(".audit-groups tbody tr")
    expect(groups).to_have_count(len(e["groups"]))
    for k, g in enumerate(e["groups"]):
        texts = groups.nth(k).locator("td").all_text_contents()  # closed <details>: not rendered
        assert texts == [
            g["group_id"],
            str(g["turns"]),
            fixed(g["w1"]),
            fixed(g["rmse"]),
            pct(g["process_sign_agreement"]),
            fixed(g["fused_w1"]),
            fixed(g["fused_rmse"]),
            pct(g["fused_sign_agreement"]),
            fixed(g["outcome_rmse"]),
        ]
    u = doc["usage"]
    expect(article.locator(".audit-usage")).to_contain_text(
        f"{u['calls']:,} requests for {u['judgments']:,} judgments · {u['prompt_tokens']:,} prompt tokens "
        f"({u['cached_prompt_tokens']:,} cached) · {u['completion_tokens']:,} completion tokens"
    )


def check_audits(page: Page, service: Service, run: str) -> None:
    """Every audit of the run, in the listing's order, as its document says."""
    listed = api(service, f"/v1/audits?run={run}")["audits"]
    assert [(a["judge"], a["scope"]) for a in listed] == AUDITS[run]
    articles = page.locator("#audits article.audit")
    expect(articles).to_have_count(len(listed))
    for k, a in enumerate(listed):
        article = articles.nth(k)
        assert article.get_attribute("data-audit") == a["audit_id"]
        expect(article.locator(".audit-title")).to_contain_text(f"Audit {a['audit_id']} · audit judge {a['judge']}")
        expect(article.locator(".audit-status")).to_have_text(a["status"])
        expect(article.locator(".audit-meta")).to_contain_text(f"seed {a['seed']}")
        if a["status"] == "done":
            doc = api(service, f"/v1/audits/{a['audit_id']}")
            check_agreement(article, doc)
            check_effect(article, doc)
        elif a["status"] == "failed":
            assert "unreachable" in a["error"]
            expect(article.locator(".audit-failed")).to_have_text(f"This audit failed: {a['error']}")
        else:
            assert a["status"] in ("queued", "running")
            expect(article.locator(".audit-pending")).to_contain_text(f"This audit is {a['status']}")


def test_the_run_page_shows_each_audit_as_its_document_says(service: Service, page: Page) -> None:
    open_page(page, service, "/ui/runs/exp")
    check_audits(page, service, "exp")
    # Batch b1's audit pairs snippet matches too (g1's search has an unvisited result).
    exp = api(service, "/v1/audits?run=exp")["audits"][2]
    assert exp["agreement"]["snippet"]["pairs"] > 0
    expect(page.locator(f'[data-audit="{exp["audit_id"]}"] .matrix[data-kind="snippet"]')).to_have_count(1)
    expect(page.locator("#no-audit")).to_be_hidden()
    page.click("#audits .audit-groups summary")  # the per-group figures open
    shot(page, "run-exp-audits")
    open_page(page, service, "/ui/runs/solo")
    check_audits(page, service, "solo")
    # The judged group's audit pairs the outcome's judgments too (its search result is
    # visited: no snippet call).
    doc = api(service, f"/v1/audits/{api(service, '/v1/audits?run=solo')['audits'][0]['audit_id']}")
    assert [kind for kind in KINDS if doc["agreement"][kind]["pairs"]] == ["visit", "report_rubric", "citation"]
    assert doc["effect"]["outcome_rmse"] is not None
    kinds = page.locator("#audits .matrix").evaluate_all("(ms) => ms.map((m) => m.dataset.kind)")
    assert kinds == ["visit", "first_visit", "report_rubric", "citation"]
    shot(page, "run-solo-audits")
    # Another tenant has no audit, and cannot read these.
    assert api(service, "/v1/audits", key=K2) == {"audits": []}


def test_a_run_without_an_audit_says_how_to_start_one(service: Service, page: Page) -> None:
    open_page(page, service, "/ui/runs/many")
    notice = page.locator("#no-audit")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text("drcredit audit start --judge NAME --run many --sample 20")
    expect(notice).to_contain_text('POST /v1/audits with {"judge": "NAME", "scope": {"run": "many"}')
    expect(page.locator("#audits article")).to_have_count(0)


@pytest.mark.parametrize("width", [1440, 700])
def test_confusion_matrices_sit_side_by_side_without_overlap(service: Service, page: Page, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    open_page(page, service, "/ui/runs/solo")
    main = boxes(page, "main")[0]
    article = boxes(page, "#audits article.audit")[0]
    matrices = boxes(page, "#audits .matrix")
    assert len(matrices) == 4
    assert overlapping(matrices) == []
    for m in matrices:
        assert m.inside(article), (m, article)
        assert m.right <= min(main.right, width) + 1, (m, width)
    if width >= 1440:
        # Wide enough: all four on one line, left to right.
        assert len({round(m.top) for m in matrices}) == 1
        assert [m.left for m in matrices] == sorted(m.left for m in matrices)
    else:
        assert len({round(m.top) for m in matrices}) > 1  # they wrap instead of overflowing
    # Every table of the audit fits the page (the per-group table opened too).
    page.click("#audits .audit-groups summary")
    for table in boxes(page, "#audits table"):
        assert table.right <= width + 1, table
    shot(page, f"run-solo-audits-{width}")


def test_the_run_report_includes_the_audits(service: Service, page: Page, tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "drcredit_cli.main", "report", "run", "exp"]
    from_service = tmp_path / "exp-url.html"
    env = {**os.environ, "DRCREDIT_API_KEY": K1}
    done = subprocess.run([*cli, "-o", str(from_service), "--url", service.url], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    from_db = tmp_path / "exp-db.html"
    env = {**os.environ, "DRCREDIT_DATABASE_URL": service.db}
    done = subprocess.run([*cli, "-o", str(from_db), "--tenant", "t1"], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    listed = api(service, "/v1/audits?run=exp")
    page.route("**/*", lambda route: route.abort() if not route.request.url.startswith("file:") else route.continue_())
    for out in (from_service, from_db):
        page.goto(out.as_uri())
        ready(page)
        data = page.evaluate("() => window.DRCREDIT_DATA")
        assert data["/v1/audits?run=exp"] == listed, out.name
        done_ids = [a["audit_id"] for a in listed["audits"] if a["status"] == "done"]
        for audit_id in done_ids:
            assert data[f"/v1/audits/{audit_id}"] == api(service, f"/v1/audits/{audit_id}"), out.name
        # Not-done audits are listed only: their document is a 409.
        assert len([p for p in data if p.startswith("/v1/audits/")]) == len(done_ids) == 1
        check_audits(page, service, "exp")
    shot(page, "report-run-exp-audits")
