"""A judge's answer read as JSON: bare, inside a fenced block, or embedded in prose."""

from __future__ import annotations

from typing import Any

import orjson

from drcredit.domain.verdicts import InvalidAnswer


def parse_json_answer(text: str) -> Any:
    """The JSON object in a judge's text: bare, inside a fenced block, or embedded in prose.

    Nothing is repaired: a truncated or malformed object is an invalid answer (and so a
    retry), never a guessed judgment.
    """
    stripped = text.strip()
    candidates = [stripped]
    fence = _fenced_block(stripped)
    if fence is not None:
        candidates.append(fence)
    start, end = stripped.find("{"), stripped.rfind("}")
    if 0 <= start < end:
        candidates.append(stripped[start : end + 1])
    for candidate in candidates:
        try:
            value = orjson.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    raise InvalidAnswer(f"no JSON object in the answer: {stripped[:120]!r}")


def _fenced_block(text: str) -> str | None:
    opening = text.find("```")
    if opening < 0:
        return None
    body_start = text.find("\n", opening)
    closing = text.find("```", body_start + 1) if body_start >= 0 else -1
    if body_start < 0 or closing < 0:
        return None
    return text[body_start + 1 : closing].strip()
