"""What search and visit tools print, read into results and pages.

Search tool responses accepted:

* JSON: a list of results, an object with ``"results"``, or a list of per-query objects
  each with ``"results"``. A result needs ``url`` (or ``link`` / ``href``); ``title`` (or
  ``name``) and ``snippet`` (or ``content`` / ``description`` / ``text``) are optional.
  ``{"error": "..."}`` sets the turn's ``error``.
* Plain text: numbered entries (``1. Title``, ``2) Title`` or ``[3] Title``; a heading
  ``1. [Title](https://...)`` carries its URL). Inside an entry, ``URL:`` / ``Link:`` or a
  bare URL line give the URL, ``Title:`` the title, ``Snippet:`` / ``Description:`` /
  ``Content:`` and any other line the snippet. Numbering may restart at 1 (one list per
  query); a Markdown heading or a ``===`` / ``---`` line ends an entry, and text before the
  first entry (``A search for 'x' found 10 results:``) is a preamble. Text with no entry
  is an empty result list when it says so (``No results found``), the turn's ``error``
  when it is a failure notice, and a :class:`ConversionError` otherwise.

Visit tool responses accepted:

* JSON: a list of pages, an object with ``"pages"``, or a single page object. A page has
  ``url`` (or ``link``; taken from the call by position when missing and the counts
  agree), ``evidence`` (or ``content``), ``summary`` and ``error``. ``{"error": "..."}``
  alone fails every called URL.
* ``<webpage url="..."><evidence>...</evidence><summary>...</summary></webpage>`` blocks
  (the paper's visit tool), with an optional ``<error>`` child or ``error`` attribute.
* Plain text in per-URL sections. A section starts with ``URL: <url>`` (or ``Page:`` /
  ``Webpage:``), a Markdown heading ending in the URL, or ``The useful information in
  <url> ...``. Inside a section ``Evidence:`` (or ``Evidence in page:``), ``Summary:`` and
  ``Error:`` start fields that run to the next key; ``Goal:`` / ``Title:`` lines are
  skipped; without an ``Evidence:`` key the section's text is the evidence. Text before
  the first section (``Visited 2 pages:``) is a preamble. A response with no section
  header is one section for the single called URL (or, if it is a failure notice, the
  failure of every called URL).

A page fails (``error`` set, ``evidence`` empty) on an explicit error, or when its
evidence is only a short failure notice: ``Failed to fetch``, ``HTTP 404``, ``403
Forbidden``, ``timed out``, ``could not be accessed``, ... A called URL that no section
answers, in a response with fewer pages than URLs, gets a page failed with ``no response
for this URL``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from drcredit.domain.urls import norm_url
from drcredit.trainers.tool_ids import printed_id

NO_RESPONSE = "no response"
MISSING_PAGE = "no response for this URL"


class ConversionError(ValueError):
    """A trajectory that cannot be converted, with where (``messages[3]``, ``block 5 ...``)."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}")


# ----------------------------------------------------------------------------- failures

_FAILURE_NOTICE = re.compile(
    r"^\W*(?:error|failed|failure|timeout|timed out)\b\s*[:\-!(]"
    r"|^\W*(?:timeout|timed out)\b"
    r"|\bfailed to (?:fetch|load|retrieve|access|visit|open|read|crawl|get)\b"
    r"|\bcould not be (?:accessed|fetched|retrieved|loaded|reached|processed|opened)\b"
    r"|\b(?:unable to|could not|couldn't|cannot) (?:fetch|access|retrieve|load|reach|open|visit)\b"
    r"|\bhttp(?: error| status(?: code)?)?\s*:?\s*[45]\d\d\b"
    r"|\bstatus(?: code)?\s*:?\s*[45]\d\d\b"
    r"|\b[45]\d\d\s*(?:client error|server error|not found|forbidden|unauthorized|gone|too many requests"
    r"|internal server error|bad gateway|service unavailable|gateway time-?out)\b"
    r"|\b(?:request|connection|read|page load|navigation)\s+(?:timed out|timeout)\b",
    re.I,
)
_NO_RESULTS = re.compile(
    r"\bno (?:relevant |search |web )?results\b|\b(?:found|returned) 0 results\b|\bnothing found\b", re.I
)
_NOTICE_LIMIT = 300


def _failure(text: str | None) -> str | None:
    """The text itself when it is only a short failure notice, else None."""
    if not text:
        return None
    stripped = text.strip()
    if len(stripped) <= _NOTICE_LIMIT and _FAILURE_NOTICE.search(stripped):
        return stripped
    return None


# ----------------------------------------------------------------------------- search responses

_ENTRY = re.compile(r"^\s*(?:(\d+)[.)]|\[(\d+)\])\s+(.*)$")
_MD_LINK = re.compile(r"^\[(?P<title>[^\]]*)\]\((?P<url>[^)\s]+)\)\s*(?P<rest>.*)$")
_URL_LINE = re.compile(r"^\s*<?(https?://[^\s>]+)>?\s*$")
_RESULT_KEY = re.compile(r"^\s*(title|url|link|source url|snippet|description|content)\s*:\s*(.*)$", re.I)
_BREAK = re.compile(r"^\s*(?:#{1,6}\s|={3,}\s*$|-{3,}\s*$|\*{3,}\s*$|_{3,}\s*$)")


def search_results(content: Any, where: str) -> tuple[list[dict[str, Any]], str | None]:
    """``(results, error)``; each result's ``id`` is the one the tool printed, or None."""
    parsed = _maybe_json(content)
    if parsed is not None:
        return _json_results(parsed, where)
    text = str(content).strip()
    entries = _text_entries(text, where)
    if not entries:
        if not text or _NO_RESULTS.search(text):
            return [], None
        notice = _failure(text)
        if notice:
            return [], notice
        raise ConversionError(where, f"search response is neither JSON nor numbered text entries: {_preview(text)!r}")
    return [dict(e, id=None) for e in entries], None


def _maybe_json(content: Any) -> Any:
    """Parsed JSON (a dict or list), or None for text that is not JSON."""
    if isinstance(content, (dict, list)):
        return content
    if isinstance(content, str) and content.strip()[:1] in ("[", "{"):
        try:
            value = json.loads(content)
        except json.JSONDecodeError:
            return None  # e.g. "[1] Title" or "[Title](url)": plain text
        return value if isinstance(value, (dict, list)) else None
    return None


def _error_text(value: Mapping[str, Any]) -> str | None:
    """The ``error`` an object names (a non-empty string, or any other true value as text)."""
    error = value.get("error")
    if error in (None, False, "") or (isinstance(error, str) and not error.strip()):
        return None
    return error.strip() if isinstance(error, str) else json.dumps(error)


def _json_results(value: Any, where: str) -> tuple[list[dict[str, Any]], str | None]:
    """Results of a JSON search response, and its error when it failed.

    A response that names an error and returns no result failed, whether or not it has an
    empty ``results`` list (``{"error": "rate limited", "results": []}``), and so does a
    list of per-query objects every one of which failed. An error next to results (one
    query of two failed) is a search that returned those results.
    """
    errors: list[str] = []
    if isinstance(value, dict):
        error = _error_text(value)
        if "results" in value:
            items = value["results"]
            if error:
                errors.append(error)
        elif error:
            return [], error
        elif first_arg(value, ("url", "link", "href")) is not None:
            items = [value]
        else:
            raise ConversionError(where, f"JSON search response has no 'results' list (keys: {sorted(value)})")
    else:
        items = value
    if not isinstance(items, list):
        raise ConversionError(where, "'results' of the JSON search response must be a list")
    flat: list[Any] = []
    for item in items:
        if isinstance(item, Mapping) and isinstance(item.get("results"), list):
            flat.extend(item["results"])  # one object per query
            if _error_text(item):
                errors.append(str(_error_text(item)))
        elif isinstance(item, Mapping) and _error_text(item) and first_arg(item, ("url", "link", "href")) is None:
            errors.append(str(_error_text(item)))  # a query that failed
        else:
            flat.append(item)
    results = []
    for j, item in enumerate(flat):
        if not isinstance(item, Mapping):
            raise ConversionError(where, f"search result {j} is not an object: {_preview(repr(item))}")
        url = first_arg(item, ("url", "link", "href"))
        if not isinstance(url, str) or not url.strip():
            raise ConversionError(where, f"search result {j} has no url")
        results.append(
            {
                "id": printed_id(item.get("id")),
                "url": url.strip(),
                "title": as_str(first_arg(item, ("title", "name"))),
                "snippet": as_str(first_arg(item, ("snippet", "content", "description", "text"))),
            }
        )
    if errors and not results:
        return [], "; ".join(dict.fromkeys(errors))
    return results, None


def _text_entries(text: str, where: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    last_number = 0
    for line in text.splitlines():
        if _BREAK.match(line):
            current = None
            continue
        entry = _ENTRY.match(line)
        number = int(entry.group(1) or entry.group(2)) if entry else 0
        if entry and (number == 1 or number == last_number + 1):
            last_number = number
            current = {"number": number, "url": "", "title": "", "snippet": []}
            entries.append(current)
            head = entry.group(3).strip()
            link = _MD_LINK.match(head)
            bare = _URL_LINE.match(head)
            if link:
                current["title"], current["url"] = link["title"].strip(), link["url"]
                if link["rest"].strip():
                    current["snippet"].append(link["rest"].strip())
            elif bare:
                current["url"] = bare.group(1)
            else:
                current["title"] = head
            continue
        if current is None or not line.strip():
            continue
        key = _RESULT_KEY.match(line)
        bare = _URL_LINE.match(line)
        if key and key.group(1).lower() == "title" and not current["title"]:
            current["title"] = key.group(2).strip()
        elif key and key.group(1).lower() in ("url", "link", "source url") and not current["url"]:
            current["url"] = key.group(2).strip().strip("<>")
        elif key and key.group(1).lower() in ("snippet", "description", "content"):
            current["snippet"].append(key.group(2).strip())
        elif bare and not current["url"]:
            current["url"] = bare.group(1)
        else:
            current["snippet"].append(line.strip())
    out = []
    for e in entries:
        if not e["url"]:
            raise ConversionError(where, f"search entry {e['number']} ({_preview(e['title'])!r}) has no URL")
        out.append({"url": e["url"], "title": e["title"], "snippet": "\n".join(s for s in e["snippet"] if s)})
    return out


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
    parsed = _maybe_json(content)
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
        error = _failure(evidence)
    if error is not None:
        evidence = ""
    return {"id": page_id, "url": url, "evidence": evidence, "summary": summary, "error": error}


def _everywhere(urls: list[str], error: str) -> list[dict[str, Any]]:
    return [{"url": u, "evidence": None, "summary": None, "error": error, "id": None} for u in (urls or [""])]


def _json_pages(value: Any, urls: list[str], where: str) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        if "pages" in value:
            items = value["pages"]
            error = _error_text(value)
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
            raise ConversionError(where, f"page {j} is not an object: {_preview(repr(item))}")
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
                "evidence": _opt_str(first_arg(item, ("evidence", "content"))),
                "summary": _opt_str(item.get("summary")),
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
        notice = None if "evidence" in fields else fields.get("error") or _failure(fields.get("body"))
        if notice:
            return _everywhere(urls, notice)
        if len(urls) > 1:
            raise ConversionError(
                where, f"visit response for {len(urls)} URLs has no per-URL sections: {_preview(text.strip())!r}"
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


# ----------------------------------------------------------------------------- output


def as_str(value: Any) -> str:
    return "" if value is None else str(value)


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _preview(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_arg(arguments: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for key in keys:
        if key in arguments:
            return arguments[key]
    return None
