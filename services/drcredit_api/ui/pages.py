"""Rendering the viewer's pages: served (assets by URL) or inlined into one file."""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

STATIC = Path(__file__).parent / "static"
TITLES = {"index": "runs", "group": "group", "run": "run"}


@cache
def environment() -> Environment:
    return Environment(loader=PackageLoader("drcredit_api.ui", "templates"), autoescape=select_autoescape(["html"]))


def plotly_js() -> Path:
    """The Plotly bundle shipped inside the ``plotly`` Python package."""
    return Path(str(files("plotly") / "package_data" / "plotly.min.js"))


@cache
def inline_assets() -> dict[str, str]:
    return {
        "css": (STATIC / "viewer.css").read_text(),
        "js": (STATIC / "viewer.js").read_text(),
        "plotly": plotly_js().read_text(),
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
            assets=inline_assets() if inline else {},
        )
    )
