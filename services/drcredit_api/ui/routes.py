"""The ``/ui`` routes: page shells and their assets. No data is served here; the pages
read the ``/v1`` endpoints with the reader's key, so tenant scoping is the API's own."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

from drcredit_api.ui.pages import FAVICON, STATIC, plotly_js, render

router = APIRouter(prefix="/ui", include_in_schema=False)
static = StaticFiles(directory=STATIC)
#: Outside /ui: what a browser asks for by itself when a page names no icon (a JSON
#: endpoint opened in a tab, for one).
root = APIRouter(include_in_schema=False)
#: A page answers HEAD as GET without the body: link checkers and uptime monitors ask so.
PAGE_METHODS = ["GET", "HEAD"]


@router.api_route("", methods=PAGE_METHODS, response_class=HTMLResponse)
@router.api_route("/", methods=PAGE_METHODS, response_class=HTMLResponse)
async def index() -> str:
    return render("index", {})


@router.api_route("/groups/{group_id}", methods=PAGE_METHODS, response_class=HTMLResponse)
async def group_page(group_id: str) -> str:
    return render("group", {"group": group_id})


@router.api_route("/runs/{run}", methods=PAGE_METHODS, response_class=HTMLResponse)
async def run_page(run: str) -> str:
    return render("run", {"run": run})


@router.api_route("/labels", methods=PAGE_METHODS, response_class=HTMLResponse)
async def labels_page() -> str:
    """The labeling page: its scope, kind and labeler come in the query string."""
    return render("labels", {})


@router.api_route("/usage", methods=PAGE_METHODS, response_class=HTMLResponse)
async def usage_page() -> str:
    return render("usage", {})


@router.api_route("/static/plotly.min.js", methods=PAGE_METHODS)
async def plotly() -> FileResponse:
    return FileResponse(plotly_js(), media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})


@root.api_route("/favicon.ico", methods=PAGE_METHODS)
async def favicon() -> FileResponse:
    return FileResponse(FAVICON, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})
