"""What the viewer's tests share: the service's address and keys, reading the API, and
measuring where things are on a page (boxes in CSS pixels, as the browser lays them out)."""

from __future__ import annotations

import shutil
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any, NamedTuple

import httpx
from playwright.sync_api import Page

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
K1, K2 = "k1", "k2"


class Service(NamedTuple):
    url: str
    db: str


def api(service: Service, path: str, key: str = K1) -> Any:
    r = httpx.get(service.url + path, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def use_key(page: Page, url: str, key: str) -> None:
    page.goto(url + "/ui")
    page.fill("#key-input", key)
    page.click("#key-form button")
    page.wait_for_selector("body[data-ready]")


def ready(page: Page) -> None:
    page.wait_for_selector("body[data-ready]")
    assert page.get_attribute("body", "data-ready") == "true", page.inner_text("#problem")


def open_page(page: Page, service: Service, path: str) -> None:
    use_key(page, service.url, K1)
    page.goto(service.url + path)
    ready(page)


class Box(NamedTuple):
    """An element's border box; ``what`` names it in failure messages."""

    what: str
    text: str
    left: float
    top: float
    right: float
    bottom: float

    @property
    def width(self) -> float:
        return self.right - self.left

    def overlaps(self, other: Box, slack: float = 1.0) -> bool:
        """True when the two share more than ``slack`` px in both directions."""
        across = min(self.right, other.right) - max(self.left, other.left)
        down = min(self.bottom, other.bottom) - max(self.top, other.top)
        return across > slack and down > slack

    def inside(self, other: Box, slack: float = 1.0) -> bool:
        return (
            self.left >= other.left - slack
            and self.top >= other.top - slack
            and self.right <= other.right + slack
            and self.bottom <= other.bottom + slack
        )


def boxes(page: Page, selector: str) -> list[Box]:
    """The boxes of every element matching ``selector`` that takes up room, in DOM order."""
    found = page.evaluate(
        """(sel) => Array.from(document.querySelectorAll(sel)).map((n) => {
             const r = n.getBoundingClientRect();
             return [n.textContent.trim().slice(0, 40), r.left, r.top, r.right, r.bottom];
           }).filter((b) => b[3] > b[1] || b[4] > b[2])""",
        selector,
    )
    return [Box(f"{selector} {text!r}", text, left, top, right, bottom) for text, left, top, right, bottom in found]


def overlapping(items: list[Box]) -> list[tuple[Box, Box]]:
    return [(a, b) for i, a in enumerate(items) for b in items[i + 1 :] if a.overlaps(b)]


def fixed(x: float, digits: int = 2) -> str:
    """``x`` as the viewer shows it, JavaScript's ``Number.prototype.toFixed``: the exact
    binary value rounded, a tie away from zero. Python's ``:.2f`` rounds a tie to even,
    so 2.625 (exact in binary) is 2.62 there and 2.63 in the page."""
    exact = Decimal(abs(x) if x == 0 else x)  # -0.0 shows as 0.00, as in the page
    return str(exact.quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))
