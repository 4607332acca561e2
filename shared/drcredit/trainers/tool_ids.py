"""Result and page ids: the ones the tool printed, made unique within the rollout.

A report cites pages by the ids the visit tool showed the agent (``<cite id="W101">``),
and the judges should see the pages under those same ids, so an id the tool printed is
kept. Two kinds of entries need a new id:

* an entry the tool printed no id for: it gets the first free ``S<n>`` (results) or
  ``W<n>`` (pages), counting from 1 in turn order, so a tool that prints no ids gets
  ``W1, W2, ...`` in turn order (failed pages included);
* an id printed more than once in the rollout (a tool numbering each call from 1, or
  reprinting a page): one occurrence keeps it and the others get free ids. The one that
  keeps it is the one a report citing that id means: the latest usable page printed under
  it (no error, some evidence), else the latest. A report is never rewritten: its
  citations name the id the agent last saw, and that id still resolves to that page.

Results and pages are two id spaces, as in the input format (an ``S3`` result and an
``S3`` page do not collide).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

from drcredit.domain.group import page_usable
from drcredit.domain.text import text_problem

#: the longest id the service stores
MAX_ID_LENGTH = 256


def printed_id(value: Any) -> str | None:
    """The id a tool printed, as the service stores it; None when there is none it could store.

    Numbers become text (``{"id": 3}`` is ``"3"``); an id that is blank, too long or not
    storable text counts as not printed (the entry then gets a new id).
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value).strip()
    if not text or len(text) > MAX_ID_LENGTH or text_problem(text) is not None:
        return None
    return text


def assign_ids(turns: Sequence[MutableMapping[str, Any]]) -> None:
    """Give every result and page of one rollout's turns its final, unique ``id`` (in place).

    On entry each result and page holds the id its tool printed, or None.
    """
    _assign(list(_entries(turns, "search", "results")), "S", lambda _: True)
    _assign(list(_entries(turns, "visit", "pages")), "W", lambda p: page_usable(p.get("error"), p.get("evidence")))


def _entries(turns: Sequence[MutableMapping[str, Any]], kind: str, key: str) -> Iterator[MutableMapping[str, Any]]:
    for turn in turns:
        if turn.get("type") == kind:
            yield from turn.get(key) or []


def _assign(entries: list[MutableMapping[str, Any]], prefix: str, usable: Callable[[Mapping[str, Any]], bool]) -> None:
    keeper: dict[str, int] = {}  # printed id -> position of the entry that keeps it
    for position, entry in enumerate(entries):
        printed = entry.get("id")
        if printed is None:
            continue
        held = keeper.get(printed)
        if held is None or usable(entry) or not usable(entries[held]):
            keeper[printed] = position
    taken = set(keeper)
    number = 0
    for position, entry in enumerate(entries):
        printed = entry.get("id")
        if printed is not None and keeper[printed] == position:
            continue
        number += 1
        while f"{prefix}{number}" in taken:
            number += 1
        entry["id"] = f"{prefix}{number}"
        taken.add(entry["id"])
