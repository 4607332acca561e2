"""No page of the viewer asks for anything it does not get: every request answered, no
console error, and an icon (the browser's own request for one included: it shows in the
console as a failed resource when missing)."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Response

from tests.ui.helpers import K1, Service, ready

PAGES = [
    "/ui",
    "/ui/groups/g1",
    "/ui/groups/judged",
    "/ui/groups/long",
    "/ui/runs/exp",
    "/ui/runs/solo",
    "/ui/labels",
    "/ui/labels?run=exp&kind=visit&labeler=page-check",
]


@pytest.mark.parametrize("path", PAGES)
def test_a_page_loads_without_a_failed_request(service: Service, browser: Browser, path: str) -> None:
    # A fresh context each time: a browser asks for a site's icon once, then caches the answer.
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    problems: list[str] = []

    def answered(r: Response) -> None:
        if r.status >= 400:
            problems.append(f"HTTP {r.status} {r.url}")

    def logged(m: ConsoleMessage) -> None:
        if m.type in ("error", "warning"):
            problems.append(f"console {m.type}: {m.text} at {m.location.get('url')}")

    try:
        page = context.new_page()
        page.on("response", answered)
        page.on("requestfailed", lambda r: problems.append(f"failed {r.url}: {r.failure}"))
        page.on("console", logged)
        page.on("pageerror", lambda e: problems.append(f"script error: {e}"))
        page.add_init_script(f"sessionStorage.setItem('drcredit-key', '{K1}')")
        page.goto(service.url + path)
        ready(page)
        page.wait_for_load_state("networkidle")
        icons = page.eval_on_selector_all('link[rel="icon"]', "(links) => links.map((l) => l.href)")
    finally:
        context.close()
    assert problems == []
    assert len(icons) == 1
    r = httpx.get(icons[0])
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")


def test_the_site_icon_is_served_where_browsers_look_for_it(service: Service) -> None:
    r = httpx.get(service.url + "/favicon.ico")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
    assert r.content.startswith(b"<svg")
