"""Where things land on the viewer's pages, measured in the browser: support tracks under
their turns at any rollout length, and run charts whose titles, axis labels, legends and
mode bar never cover one another, with one step and with two hundred."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.ui.conftest import MANY_STEPS
from tests.ui.helpers import Box, Service, api, boxes, open_page, overlapping, shot
from tests.ui.scenarios import LONG_TURNS

RUN_CHARTS = (
    "chart-calls",
    "chart-latency",
    "chart-credit",
    "chart-failures",
    "chart-advantage",
    "chart-cb",
    "chart-ub",
    "chart-drift",
    "chart-levels",
)


def test_support_tracks_line_up_with_their_turns_at_any_length(service: Service, page: Page) -> None:
    open_page(page, service, "/ui/groups/long")
    rollouts = {r["id"]: len(r["turns"]) for r in api(service, "/v1/groups/long/advantages")["rollouts"]}
    assert rollouts == {"long": LONG_TURNS, "short": 4}
    for rollout, turns in rollouts.items():
        cells = boxes(page, f'.row[data-rollout="{rollout}"] .cell[data-kind="turn"]')
        outcome = boxes(page, f'.row[data-rollout="{rollout}"] .cell.outcome')[0]
        label = boxes(page, f'.row[data-rollout="{rollout}"] .label')[0]
        assert len(cells) == turns
        for rubric in ("R1", "R2"):
            track = f'.track[data-rollout="{rollout}"][data-rubric="{rubric}"]'
            ticks = boxes(page, track + " .tick")
            assert len(ticks) == turns
            spacer, track_label = boxes(page, track + " .spacer")[0], boxes(page, track + " .label")[0]
            assert abs(spacer.left - outcome.left) <= 1 and abs(spacer.width - outcome.width) <= 1
            assert abs(track_label.left - label.left) <= 1 and abs(track_label.width - label.width) <= 1
            for k, (cell, tick) in enumerate(zip(cells, ticks, strict=True)):
                assert abs(tick.left - cell.left) <= 1, (
                    f"{rollout} {rubric} turn {k}: tick at {tick.left}, turn at {cell.left}"
                )
                assert abs(tick.width - cell.width) <= 1, f"{rollout} {rubric} turn {k}: {tick.width} vs {cell.width}"
                assert tick.top >= cell.bottom  # under its turn, not beside it
    shot(page, "group-long")


def chart_parts(page: Page, chart: str) -> tuple[Box, Box, list[Box]]:
    """The chart's box, its title's, and every part drawn in it that must not cover another."""
    root = f"#{chart}"
    parts = [
        *boxes(page, f"{root} .xtick text"),
        *boxes(page, f"{root} .ytick text"),
        *boxes(page, f"{root} .y2tick text"),
        *boxes(page, f"{root} .g-xtitle text"),
        *boxes(page, f"{root} .g-ytitle text"),
        *boxes(page, f"{root} .g-y2title text"),
        *boxes(page, f"{root} .legend"),
        *boxes(page, f"{root} .colorbar"),
        *boxes(page, f"{root} .modebar"),
        *boxes(page, f"{root} .draglayer .xy .nsewdrag")[:1],  # the plot area
    ]
    return boxes(page, root)[0], boxes(page, f"#{chart}-title")[0], parts


@pytest.mark.parametrize(
    ("run", "width"),
    [("solo", 1440), ("many", 1440), ("many", 1040)],
    ids=["1-step", f"{MANY_STEPS}-steps", f"{MANY_STEPS}-steps-narrow"],
)
def test_run_charts_stay_legible(service: Service, page: Page, run: str, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    open_page(page, service, f"/ui/runs/{run}")
    steps = api(service, f"/v1/runs/{run}")["steps"]
    for chart in RUN_CHARTS:
        page.hover(f"#{chart}")  # the mode bar shows on hover
        box, title, parts = chart_parts(page, chart)
        assert any(".modebar" in p.what for p in parts), f"{chart}: no mode bar measured"
        assert not title.overlaps(box, slack=0) and title.bottom <= box.top + 1, f"{chart}: title {title} over the plot"
        for part in parts:
            assert part.inside(box), f"{chart}: {part.what!r} spills out of the chart {box}"
        clashes = overlapping(parts)
        assert not clashes, f"{chart}: {[(a.what, b.what) for a, b in clashes]}"
        if chart not in ("chart-cb", "chart-ub"):
            ticks = [b.text for b in boxes(page, f"#{chart} .xtick text")]
            assert 1 <= len(ticks) <= 11, f"{chart}: {len(ticks)} step labels"
            if len(steps) == 1:
                assert ticks == [str(steps[0]["step"])]
    shot(page, f"run-{run}-{width}")


def test_run_summary_counts_in_words(service: Service, page: Page) -> None:
    open_page(page, service, "/ui/runs/solo")
    expect(page.locator("#run-summary")).to_have_text("1 step · 1 group · 3 trajectories scored")
    open_page(page, service, "/ui/runs/exp")
    expect(page.locator("#run-summary")).to_have_text("2 steps · 3 groups · 6 trajectories scored")


def test_a_run_without_a_batch_says_how_to_get_one(service: Service, page: Page) -> None:
    open_page(page, service, "/ui/runs/solo")
    notice = page.locator("#no-batch")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text("POST /v1/batches")
    expect(notice).to_contain_text("submit_batch")
    # no empty picker or table left on the page: they take no room at all
    assert boxes(page, "#batch-picker") == [] and boxes(page, "#sensitivity") == []
    heading, glossary = boxes(page, "#sens-title")[0], boxes(page, "#glossary-title")[0]
    shown = boxes(page, "#no-batch")[0]
    assert heading.bottom <= shown.top and shown.bottom <= glossary.top
