"""The run page's drift section in headless Chromium: the judge's levels per step and each
step's drift, as ``GET /v1/runs/{run}`` gives them, with the flagged steps marked.

Run ``drifting`` (tests/support/scenarios.py, ``DRIFT_GROUPS``) has five steps; its
levels move away from the first three steps at step 4. The viewer's judge answers every
visit (the page the API test's judge fails reads as level 0 here), so the figures are read
from the API and compared with what the page shows.
"""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.ui.helpers import Service, api, fixed, open_page, shot

KINDS = ("visit", "report_rubric")


def test_run_page_shows_levels_and_drift_per_step(service: Service, page: Page) -> None:
    open_page(page, service, "/ui/runs/drifting")
    run = api(service, "/v1/runs/drifting")
    steps = run["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    # The API flags step 4 for both kinds (a shift to the top level everywhere).
    assert all(steps[3]["drift"][k]["flagged"] for k in KINDS)
    rows = page.locator("#drift tbody tr")
    expect(rows).to_have_count(len(steps))
    for k, step in enumerate(steps):
        row = rows.nth(k)
        cells = row.locator("td").all_inner_texts()
        assert cells[0] == str(step["step"])
        for i, kind in enumerate(KINDS):
            levels, drift = step["judge_levels"][kind], step["drift"][kind]
            assert cells[1 + 3 * i] == str(levels["judgments"])
            assert cells[2 + 3 * i] == " / ".join(f"{fixed(100 * v, 1)}%" for v in levels["shares"])
            shown = cells[3 + 3 * i]
            if drift["value"] is None:
                assert shown == "–"
            else:
                assert shown.startswith(f"{fixed(drift['value'], 3)}")
            assert ("flagged" in shown) == drift["flagged"]
        flagged = any(step["drift"][kind]["flagged"] for kind in KINDS)
        assert row.get_attribute("data-flagged") == ("true" if flagged else None)
    # The charts draw the document's values: the drift per kind and the threshold (a dotted
    # line across the plot), and the visit level shares stacked.
    drawn = page.evaluate("() => document.getElementById('chart-drift').data.map(t => t.y)")
    assert drawn == [[s["drift"][kind]["value"] for s in steps] for kind in KINDS]
    line = page.evaluate("() => document.getElementById('chart-drift').layout.shapes.map(s => [s.y0, s.y1])")
    assert line == [[run["drift_baseline"]["threshold"]] * 2]
    shares = page.evaluate("() => document.getElementById('chart-levels').data.map(t => t.y)")
    assert shares == [[s["judge_levels"]["visit"]["shares"][i] for s in steps] for i in range(3)]
    base = run["drift_baseline"]
    n = sum(any(s["drift"][k]["flagged"] for k in KINDS) for s in steps)
    expect(page.locator("#drift-summary")).to_have_text(
        f"Baseline: steps 1, 2, 3 pooled · threshold {base['threshold']} · {n} step{'' if n == 1 else 's'} flagged"
    )
    shot(page, "run-drifting")


def test_a_run_of_fewer_than_four_steps_says_so(service: Service, page: Page) -> None:
    open_page(page, service, "/ui/runs/exp")
    expect(page.locator("#drift-summary")).to_contain_text("Fewer than four numbered steps")
    assert all(t == "–" for t in page.locator("#drift td[data-kind]").all_inner_texts())
