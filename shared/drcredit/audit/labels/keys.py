"""The keys people label: those the judge audit pairs, named the same way.

Internally a key is ``(kind, rollout id, turn index, key id)``: visit and snippet keys
carry their turn and the rubric id; report-rubric keys (the rubric id) and citation keys
(the claim index) have no turn (-1). Publicly a key is a small object
(:func:`public_key`), and an item id packs the group id with it so that a page can post
a label back by one opaque string.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from drcredit.audit.report import KINDS
from drcredit.domain.errors import FieldError, InvalidInput
from drcredit.domain.outcome import JOINT
from drcredit.domain.text import text_problem

#: (kind, rollout id, turn index or -1, rubric id or claim index)
Key = tuple[str, str, int, str]
#: The stored judgment kind behind each audit kind.
JUDGMENT_KIND = {"visit": "visit", "snippet": "snippet", "report_rubric": "rubric", "citation": "citation"}
NO_TURN = -1
ITEM_PREFIX = "itm-"


@dataclass(frozen=True)
class Original:
    """The original judge's judgment at one key."""

    status: str  # ok | failed
    value: int | None
    #: Visit: the support points the judge was shown (0 for the other kinds).
    history: int = 0


def public_key(key: Key) -> dict[str, Any]:
    kind, rollout_id, turn, name = key
    if kind in ("visit", "snippet"):
        return {"rollout_id": rollout_id, "turn_index": turn, "rubric_id": name}
    if kind == "report_rubric":
        return {"rollout_id": rollout_id, "rubric_id": name}
    return {"rollout_id": rollout_id, "claim": int(name)}


def parse_key(kind: str, raw: Any, field: str = "key") -> Key:
    """A public key of ``kind`` as the internal tuple; refused naming the field."""
    if not isinstance(raw, Mapping):
        raise InvalidInput([FieldError(field, "must be an object")])
    wanted = {
        "visit": ("rollout_id", "turn_index", "rubric_id"),
        "snippet": ("rollout_id", "turn_index", "rubric_id"),
        "report_rubric": ("rollout_id", "rubric_id"),
        "citation": ("rollout_id", "claim"),
    }[kind]
    errors = [FieldError(f"{field}.{name}", f"unknown field for a {kind} key") for name in raw if name not in wanted]
    errors += [FieldError(f"{field}.{name}", "missing") for name in wanted if name not in raw]
    for name in wanted:
        value = raw.get(name)
        if name not in raw:
            continue
        if name in ("turn_index", "claim"):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                errors.append(FieldError(f"{field}.{name}", f"must be a whole number >= 0, got {value!r}"))
        elif not isinstance(value, str) or not value:
            errors.append(FieldError(f"{field}.{name}", f"must be a non-empty string, got {value!r}"))
    if errors:
        raise InvalidInput(errors)
    if kind in ("visit", "snippet"):
        return (kind, raw["rollout_id"], raw["turn_index"], raw["rubric_id"])
    if kind == "report_rubric":
        return (kind, raw["rollout_id"], NO_TURN, raw["rubric_id"])
    return (kind, raw["rollout_id"], NO_TURN, str(raw["claim"]))


def check_kind(kind: Any, field: str = "kind") -> str:
    if kind not in KINDS:
        raise InvalidInput([FieldError(field, f"unknown kind {kind!r} (one of {', '.join(KINDS)})")])
    return str(kind)


def check_value(kind: str, value: Any, field: str = "value") -> int:
    """A label's value within its kind's categories ``0..m``."""
    top = KINDS[kind]
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
        raise InvalidInput([FieldError(field, f"a {kind} label is a whole number 0..{top}, got {value!r}")])
    return value


def item_id(group_id: str, key: Key) -> str:
    """An opaque id of (group, key), safe in a URL."""
    packed = json.dumps([group_id, *key], separators=(",", ":"), ensure_ascii=False).encode()
    return ITEM_PREFIX + base64.urlsafe_b64encode(packed).decode().rstrip("=")


def parse_item_id(raw: Any, field: str = "item_id") -> tuple[str, Key]:
    """(group id, key) of an item id; refused naming the field when it is not one."""
    bad = InvalidInput([FieldError(field, f"not an item id: {raw!r}")])
    if not isinstance(raw, str) or not raw.startswith(ITEM_PREFIX):
        raise bad
    body = raw[len(ITEM_PREFIX) :]
    try:
        parts = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (binascii.Error, ValueError) as exc:
        raise bad from exc
    if (
        not isinstance(parts, list)
        or len(parts) != 5
        or not all(isinstance(p, str) for p in (parts[0], parts[1], parts[2], parts[4]))
        or not isinstance(parts[3], int)
        or parts[1] not in KINDS
    ):
        raise bad
    # The parts are looked up in the database: a NUL there would fail on Postgres.
    for part in (parts[0], parts[2], parts[4]):
        problem = text_problem(part)
        if problem is not None:
            raise InvalidInput([FieldError(field, f"a part of the item id {problem}")])
    return parts[0], (parts[1], parts[2], parts[3], parts[4])


def originals(rows: Iterable[Sequence[Any]], positive_rubrics: Sequence[str]) -> dict[Key, Original]:
    """Every key the audit would compare, from a group's judgment rows
    ``(kind, rollout_id, turn_index, rubric_id, status, level, matches, prior_support)``.

    Only judgments the judge answered or failed count (not the deterministic zeros of a
    visit without a usable page, nor a snippet call skipped as saturated); a snippet
    judgment gives one key per positive rubric (1 when it matched that rubric); a
    citation key is the claim's joint call.
    """
    out: dict[Key, Original] = {}
    for kind, rollout_id, turn, name, status, level, matches, prior in rows:
        if status not in ("ok", "failed"):
            continue
        value = level if status == "ok" else None
        if kind == "visit":
            out[("visit", rollout_id, turn, name)] = Original(status, value, prior or 0)
        elif kind == "snippet":
            matched = {m["rubric_id"] for m in matches or ()}
            for rubric in positive_rubrics:
                out[("snippet", rollout_id, turn, rubric)] = Original(
                    status, int(rubric in matched) if status == "ok" else None
                )
        elif kind == "rubric":
            out[("report_rubric", rollout_id, NO_TURN, name)] = Original(status, value)
        elif kind == "citation":
            claim, _, call = name.partition(":")
            if call == JOINT:
                out[("citation", rollout_id, NO_TURN, claim)] = Original(status, value)
    return out


def describe(key: Key) -> str:
    kind, rollout_id, turn, name = key
    where = f"rollout {rollout_id!r}" + (f", turn {turn}" if turn != NO_TURN else "")
    what = f"claim {name}" if kind == "citation" else f"rubric {name!r}"
    return f"{kind} judgment at {where}, {what}"
