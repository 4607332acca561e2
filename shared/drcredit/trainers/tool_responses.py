"""What search tools print, read into results; what every tool reader shares.

Search tool responses accepted:

* JSON: a list of results, an object with ``"results"``, or a list of per-query objects
  each with ``"results"``. A result needs ``url`` (or ``link`` / ``href``); ``title`` (or
  ``name``), ``snippet`` (or ``content`` / ``description`` / ``text``) and ``id`` are
  optional. A response that names an ``error`` and returns no result is a failed search
  (the turn's ``error``, no results), with or without an empty ``"results"`` list and
  also when every per-query object failed; an error next to results (one query of two
  failed) leaves a search that returned those results.
* Plain text: numbered entries (``1. Title``, ``2) Title`` or ``[3] Title``; a heading
  ``1. [Title](https://...)`` carries its URL). Inside an entry, ``URL:`` / ``Link:`` or a
  bare URL line give the URL, ``Title:`` the title, ``Snippet:`` / ``Description:`` /
  ``Content:`` and any other line the snippet. Numbering may restart at 1 (one list per
  query); a Markdown heading or a ``===`` / ``---`` line ends an entry, and text before the
  first entry (``A search for 'x' found 10 results:``) is a preamble. Text with no entry
  is an empty result list when it says so (``No results found``), the turn's ``error``
  when it is a failure notice, and a :class:`ConversionError` otherwise.

Visit responses are read in :mod:`drcredit.trainers.visit_responses`. Ids: each result
and page carries the id its tool printed, or None;
:func:`drcredit.trainers.tool_ids.assign_ids` gives the final, unique ones.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

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


def failure_notice(text: str | None) -> str | None:
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
    parsed = maybe_json(content)
    if parsed is not None:
        return _json_results(parsed, where)
    text = str(content).strip()
    entries = _text_entries(text, where)
    if not entries:
        if not text or _NO_RESULTS.search(text):
            return [], None
        notice = failure_notice(text)
        if notice:
            return [], notice
        raise ConversionError(where, f"search response is neither JSON nor numbered text entries: {preview(text)!r}")
    return [dict(e, id=None) for e in entries], None


def maybe_json(content: Any) -> Any:
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


def error_text(value: Mapping[str, Any]) -> str | None:
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
        error = error_text(value)
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
            if error_text(item):
                errors.append(str(error_text(item)))
        elif isinstance(item, Mapping) and error_text(item) and first_arg(item, ("url", "link", "href")) is None:
            errors.append(str(error_text(item)))  # a query that failed
        else:
            flat.append(item)
    results = []
    for j, item in enumerate(flat):
        if not isinstance(item, Mapping):
            raise ConversionError(where, f"search result {j} is not an object: {preview(repr(item))}")
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
            raise ConversionError(where, f"search entry {e['number']} ({preview(e['title'])!r}) has no URL")
        out.append({"url": e["url"], "title": e["title"], "snippet": "\n".join(s for s in e["snippet"] if s)})
    return out


# ----------------------------------------------------------------------------- output


def as_str(value: Any) -> str:
    return "" if value is None else str(value)


def opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def preview(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_arg(arguments: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for key in keys:
        if key in arguments:
            return arguments[key]
    return None
