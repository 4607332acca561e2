"""Search and visit tools for VeRL's tool agent loop, shaped for DrCredit (a sketch).

Load with ``actor_rollout_ref.rollout.multi_turn.function_tool_path=examples/verl/tools.py``.
Replace the bodies with your search backend and page reader. What matters for DrCredit is what
they return: VeRL sends a returned dict to the model as JSON, and the agent loop reads that JSON
back into the turn record (``{"results": [{"url", "title", "snippet"}]}`` for a search,
``{"pages": [{"url", "evidence", "summary"}]}`` for a visit; see
``drcredit.trainers.converters`` for the text formats that are accepted too).
"""

from __future__ import annotations

from typing import Any

from verl.tools.function_tool import function_tool


@function_tool
def search(queries: list[str]) -> dict[str, Any]:
    """Search the web.

    Args:
        queries: One or more search queries.
    """
    results: list[dict[str, str]] = []  # e.g. your search API's hits: {"url", "title", "snippet"}
    return {"results": results}


@function_tool
def visit(urls: list[str], goal: str) -> dict[str, Any]:
    """Read web pages and extract what serves the goal.

    Args:
        urls: The pages to read.
        goal: What to look for in them.
    """
    pages = [{"url": url, "evidence": "", "summary": "", "error": "not implemented"} for url in urls]
    return {"pages": pages}
