"""What visit tools print, read into pages.

Visit tool responses accepted:

* JSON: a list of pages, an object with ``"pages"``, or a single page object. A page has
  ``url`` (or ``link``; taken from the call by position when missing and the counts
  agree), ``evidence`` (or ``content``), ``summary``, ``error`` and ``id``. ``{"error":
  "..."}`` alone, or with an empty ``"pages"`` list, fails every called URL.
* ``<webpage url="..."><evidence>...</evidence><summary>...</summary></webpage>`` blocks
  (the paper's visit tool), with an optional ``<error>`` child or ``error`` attribute and
  an optional ``id`` attribute.
* Plain text in per-URL sections. A section starts with ``URL: <url>`` (or ``Page:`` /
  ``Webpage:``), a Markdown heading ending in the URL, or ``The useful information in
  <url> ...``. Inside a section ``Evidence:`` (or ``Evidence in page:``), ``Summary:`` and
  ``Error:`` start fields that run to the next key; ``Goal:`` / ``Title:`` lines are
  skipped; an ``ID: W3`` line before the evidence, or ``[W3]`` at the start of the header
  line (``[W3] URL: ...``, ``## [W3] Title https://...``), is the page's id; without an
  ``Evidence:`` key the section's text is the evidence. Text before
  the first section (``Visited 2 pages:``) is a preamble. A response with no section
  header is one section for the single called URL (or, if it is a failure notice, the
  failure of every called URL).

A page fails (``error`` set, ``evidence`` empty) on an explicit error, or when its
evidence is only a short failure notice: ``Failed to fetch``, ``HTTP 404``, ``403
Forbidden``, ``timed out``, ``could not be accessed``, ... A called URL that no section
answers, in a response with fewer pages than URLs, gets a page failed with ``no response
for this URL``.

Each page carries the id its tool printed, or None (:mod:`drcredit.trainers.tool_ids`
gives the final ones).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from drcredit.domain.urls import norm_url
from drcredit.trainers.tool_ids import printed_id
from drcredit.trainers.tool_responses import (
    MISSING_PAGE,
    ConversionError,
    as_str,
    error_text,
    failure_notice,
    first_arg,
    maybe_json,
    opt_str,
    preview,
)

# ----------------------------------------------------------------------------- visit responses

_SECTION = re.compile(
    r"^\s*(?:(?:url|page|webpage)\s*:\s*<?(?P<u1>https?://[^\s>]+)>?\s*$"
    r"|#{1,6}\s.*?<?(?P<u2>https?://[^\s>]+)>?\s*$"
    r"|the useful information in\s+<?(?P<u3>https?://[^\s>]+?)>?\s)",
    re.I,
)
_PAGE_KEY = re.compile(r"^\s*(evidence(?: in page)?|summary|error|goal|title)\s*:\s*(.*)$", re.I)
_ID_LINE = re.compile(r"^\s*(?:page\s+)?id\s*:\s*(?P<id>[A-Za-z]*\d+)\s*$", re.I)
#: an id printed before a section's header: ``[W3] URL: ...``, ``## [W3] Title https://...``
_HEADER_ID = re.compile(r"^(?P<lead>\s*(?:#{1,6}\s+)?)\[(?P<id>[A-Za-z]*\d+)\]\s*")
_SEPARATOR = re.compile(r"^\s*(?:={3,}|-{3,})\s*$")
_WEBPAGE = re.compile(r"<webpage\b([^>]*?)(?:/>|>(.*?)</webpage>)", re.S)
_ATTR = re.compile(r"([\w-]+)\s*=\s*\"([^\"]*)\"")


def visit_pages(content: Any, urls: list[str], where: str) -> list[dict[str, Any]]:
    """The pages of a visit response; each page's ``id`` is the one the tool printed, or None."""
    parsed = maybe_json(content)
    if parsed is not None:
        raw = _json_pages(parsed, urls, where)
    elif "<webpage" in str(content):
        raw = _xml_pages(str(content), urls, where)
    else:
        raw = _text_pages(str(content), urls, where)
    if len(raw) < len(urls):
        covered = {norm_url(p["url"]) for p in raw}
        raw += [
            {"url": u, "evidence": None, "summary": None, "error": MISSING_PAGE, "id": None}
            for u in urls
            if norm_url(u) not in covered
        ]
    return [page_entry(p["url"], p["evidence"], p["summary"], p["error"], page_id=p["id"]) for p in raw]


def page_entry(
    url: str,
    evidence: str | None = None,
    summary: str | None = None,
    error: str | None = None,
    *,
    page_id: str | None = None,
) -> dict[str, Any]:
    """A page; a failed page keeps its error and has empty evidence, so it is never usable."""
    evidence = evidence.strip() if isinstance(evidence, str) else evidence
    summary = summary.strip() if isinstance(summary, str) else summary
    error = error.strip() if isinstance(error, str) and error.strip() else None
    if error is None:
        error = failure_notice(evidence)
    if error is not None:
        evidence = ""
    return {"id": page_id, "url": url, "evidence": evidence, "summary": summary, "error": error}


def _everywhere(urls: list[str], error: str) -> list[dict[str, Any]]:
    return [{"url": u, "evidence": None, "summary": None, "error": error, "id": None} for u in (urls or [""])]


def _json_pages(value: Any, urls: list[str], where: str) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        if "pages" in value:
            items = value["pages"]
            error = error_text(value)
            if error and isinstance(items, list) and not items:
                return _everywhere(urls, error)  # {"error": "...", "pages": []}: the call failed
        elif value.get("error") and not any(k in value for k in ("evidence", "content", "summary", "url")):
            return _everywhere(urls, str(value["error"]))
        else:
            items = [value]
    else:
        items = value
    if not isinstance(items, list):
        raise ConversionError(where, "'pages' of the JSON visit response must be a list")
    pages = []
    for j, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ConversionError(where, f"page {j} is not an object: {preview(repr(item))}")
        url = first_arg(item, ("url", "link"))
        if url is None:
            if len(items) != len(urls):
                raise ConversionError(
                    where, f"page {j} has no url and the call has {len(urls)} URLs for {len(items)} pages"
                )
            url = urls[j]
        error = item.get("error")
        pages.append(
            {
                "url": as_str(url),
                "evidence": opt_str(first_arg(item, ("evidence", "content"))),
                "summary": opt_str(item.get("summary")),
                "error": None if error in (None, False, "") else str(error),
                "id": printed_id(item.get("id")),
            }
        )
    return pages


def _xml_pages(text: str, urls: list[str], where: str) -> list[dict[str, Any]]:
    blocks = list(_WEBPAGE.finditer(text))
    if not blocks:
        raise ConversionError(where, "a <webpage> block is never closed")
    pages = []
    for j, block in enumerate(blocks):
        attrs = dict(_ATTR.findall(block.group(1)))
        body = block.group(2) or ""
        url = attrs.get("url")
        if url is None:
            if len(blocks) != len(urls):
                raise ConversionError(
                    where, f"<webpage> {j} has no url and the call has {len(urls)} URLs for {len(blocks)} pages"
                )
            url = urls[j]
        child = {tag: _inner(body, tag) for tag in ("evidence", "summary", "error")}
        status = attrs.get("status", "")
        error = child["error"] or attrs.get("error") or (status if status.lower() in ("error", "failed") else None)
        pages.append(
            {
                "url": url,
                "evidence": child["evidence"],
                "summary": child["summary"],
                "error": error,
                "id": printed_id(attrs.get("id")),
            }
        )
    return pages


def _inner(body: str, tag: str) -> str | None:
    match = re.search(rf"<{tag}\b[^>]*>(.*?)</{tag}>", body, re.S)
    return match.group(1) if match else None


def _text_pages(text: str, urls: list[str], where: str) -> list[dict[str, Any]]:
    sections: list[tuple[str | None, list[str]]] = []
    preamble: list[str] = []
    for line in text.splitlines():
        header = _SECTION.match(_HEADER_ID.sub(r"\g<lead>", line, count=1))
        if header:
            url = header.group("u1") or header.group("u2") or header.group("u3")
            printed = _HEADER_ID.match(line)
            sections.append((url, [f"Id: {printed['id']}"] if printed else []))
        elif _SEPARATOR.match(line):
            continue
        elif sections:
            sections[-1][1].append(line)
        else:
            preamble.append(line)
    if not sections:
        fields = _page_fields(preamble)
        notice = None if "evidence" in fields else fields.get("error") or failure_notice(fields.get("body"))
        if notice:
            return _everywhere(urls, notice)
        if len(urls) > 1:
            raise ConversionError(
                where, f"visit response for {len(urls)} URLs has no per-URL sections: {preview(text.strip())!r}"
            )
        return [_text_page(urls[0] if urls else "", preamble)]
    return [_text_page(url or "", lines) for url, lines in sections]  # a preamble is tool chatter


def _page_fields(lines: list[str]) -> dict[str, str]:
    """Split a section into its keyed fields; text before any key is ``body``.

    Once inside the evidence or the summary, only the other of the two starts a new
    field, so page text with a line like ``Error: ...`` or ``Title: ...`` stays evidence.
    """
    fields: dict[str, list[str]] = {}
    key = "body"
    for line in lines:
        page_id = _ID_LINE.match(line)
        if page_id and key not in ("evidence", "summary"):
            fields["id"] = [page_id["id"]]
            continue
        match = _PAGE_KEY.match(line)
        new = match.group(1).lower().split()[0] if match else None
        if match and new and (key not in ("evidence", "summary") or new in ("evidence", "summary")):
            key = new
            fields.setdefault(key, []).append(match.group(2))
        else:
            fields.setdefault(key, []).append(line)
    return {k: "\n".join(v).strip() for k, v in fields.items()}


def _text_page(url: str, lines: list[str]) -> dict[str, Any]:
    fields = _page_fields(lines)
    evidence = fields.get("evidence", fields.get("body"))
    return {
        "url": url,
        "evidence": evidence,
        "summary": fields.get("summary"),
        "error": fields.get("error") or None,
        "id": printed_id(fields.get("id")),
    }
