"""Rendering the viewer's pages: served (assets by URL) or inlined into one file."""

from __future__ import annotations

import base64
import json
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

STATIC = Path(__file__).parent / "static"
TITLES = {"index": "runs", "group": "group", "run": "run", "labels": "labeling", "usage": "usage"}
#: The page scripts, in load order: the shared part first, each page's own after it.
SCRIPTS = (
    "core.js",
    "glossary.js",
    "charts.js",
    "details.js",
    "group.js",
    "audits.js",
    "run.js",
    "index.js",
    "labels.js",
    "usage.js",
)
FAVICON = STATIC / "favicon.svg"


@cache
def environment() -> Environment:
    return Environment(loader=PackageLoader("drcredit_api.ui", "templates"), autoescape=select_autoescape(["html"]))


def plotly_js() -> Path:
    """The Plotly bundle shipped inside the ``plotly`` Python package."""
    return Path(str(files("plotly") / "package_data" / "plotly.min.js"))


@cache
def inline_assets() -> dict[str, Any]:
    return {
        "css": (STATIC / "viewer.css").read_text(),
        "scripts": [(STATIC / "js" / name).read_text() for name in SCRIPTS],
        "plotly": plotly_js().read_text(),
        # A report fetches nothing, its icon included.
        "favicon": "data:image/svg+xml;base64," + base64.b64encode(FAVICON.read_bytes()).decode(),
    }


def render(page: str, params: dict[str, str], *, base: str = "/ui", data: dict[str, Any] | None = None) -> str:
    """A page; with ``data`` (JSON by API path) a self-contained report of it."""
    title = TITLES[page] + (f" {next(iter(params.values()))}" if params else "")
    inline = data is not None
    embedded = ""
    if inline:
        # JSON inside a <script>: "</" must not end the script early.
        embedded = json.dumps(data, allow_nan=False).replace("</", "<\\/")
    return (
        environment()
        .get_template(f"{page}.html")
        .render(
            title=title,
            page=page,
            params=params,
            base=base,
            inline=inline,
            data=embedded,
            scripts=SCRIPTS,
            assets=inline_assets() if inline else {},
        )
    )
