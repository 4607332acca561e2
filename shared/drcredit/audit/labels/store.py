"""Storing people's labels: one value per (tenant, group, key, labeler).

A label names its judgment by ``item_id`` (as the queue offers it) or by ``group_id``,
``kind`` and ``key``; its value must lie in the kind's categories, its key must be one
the audit compares in that group, and the group must be this tenant's (another
tenant's group reads as unknown). A second label by the same labeler on the same key
replaces the first. An import checks every label first and stores all or nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from drcredit.audit.labels.keys import (
    JUDGMENT_KIND,
    NO_TURN,
    Key,
    Original,
    check_kind,
    check_value,
    describe,
    item_id,
    originals,
    parse_item_id,
    parse_key,
    public_key,
)
from drcredit.audit.labels.schemas import LabelIn
from drcredit.domain.errors import FieldError, InvalidInput
from drcredit.scoring.errors import NotFound
from drcredit.storage import models as m


def positive_rubrics(group: m.Group) -> list[str]:
    return [r["id"] for r in group.rubrics if float(r.get("weight") or 0) > 0]


def group_originals(s: Session, group: m.Group, judgment_kind: str | None = None) -> dict[Key, Original]:
    """Every key of the group the audit compares, with the original judgment at it."""
    j = m.Judgment
    query = select(
        j.kind, j.rollout_id, j.turn_index, j.rubric_id, j.status, j.level, j.matches, j.prior_support
    ).where(j.group_pk == group.id)
    if judgment_kind is not None:
        query = query.where(j.kind == judgment_kind)
    return originals(s.execute(query), positive_rubrics(group))


@dataclass(frozen=True)
class Resolved:
    group: m.Group
    key: Key
    original: Original


class _Groups:
    """This tenant's groups and their keys, each read once."""

    def __init__(self, s: Session, tenant: str):
        self.s, self.tenant = s, tenant
        self._groups: dict[str, m.Group | None] = {}
        self._keys: dict[int, dict[Key, Original]] = {}

    def group(self, group_id: str) -> m.Group | None:
        if group_id not in self._groups:
            self._groups[group_id] = self.s.scalar(
                select(m.Group).where(m.Group.tenant == self.tenant, m.Group.group_id == group_id)
            )
        return self._groups[group_id]

    def keys(self, group: m.Group) -> dict[Key, Original]:
        if group.id not in self._keys:
            self._keys[group.id] = group_originals(self.s, group)
        return self._keys[group.id]


def _resolve(groups: _Groups, label: LabelIn, at: str = "") -> tuple[Resolved, int]:
    """The label's group, key and original judgment, and its checked value."""
    if label.item_id is not None:
        group_id, key = parse_item_id(label.item_id, f"{at}item_id")
        if label.group_id is not None and label.group_id != group_id:
            raise InvalidInput(
                [FieldError(f"{at}group_id", f"{label.group_id!r} is not the item's group {group_id!r}")]
            )
        if label.kind is not None and label.kind != key[0]:
            raise InvalidInput([FieldError(f"{at}kind", f"{label.kind!r} is not the item's kind {key[0]!r}")])
        if label.key is not None and parse_key(key[0], label.key, f"{at}key") != key:
            raise InvalidInput([FieldError(f"{at}key", "is not the item's key")])
        group_field = f"{at}item_id"
    else:
        errors = [
            FieldError(f"{at}{name}", "missing (give item_id, or group_id, kind and key)")
            for name in ("group_id", "kind", "key")
            if getattr(label, name) is None
        ]
        if errors:
            raise InvalidInput(errors)
        assert label.group_id is not None
        group_id = label.group_id
        key = parse_key(check_kind(label.kind, f"{at}kind"), label.key, f"{at}key")
        group_field = f"{at}group_id"
    value = check_value(key[0], label.value, f"{at}value")
    group = groups.group(group_id)
    if group is None:
        raise NotFound(f"group {group_id!r} not found", group_field)
    original = groups.keys(group).get(key)
    if original is None:
        field = f"{at}item_id" if label.item_id is not None else f"{at}key"
        raise InvalidInput([FieldError(field, f"group {group_id!r} has no {describe(key)}")])
    return Resolved(group, key, original), value


def label_json(group_id: str, row: m.Label) -> dict[str, Any]:
    key: Key = (row.kind, row.rollout_id, row.turn_index, row.key_id)
    return {
        "item_id": item_id(group_id, key),
        "group_id": group_id,
        "kind": row.kind,
        "key": public_key(key),
        "value": row.value,
        "labeler": row.labeler,
        "created_at": row.created_at.isoformat(),
        "updated_at": row.updated_at.isoformat(),
    }


def _upsert(s: Session, tenant: str, items: Sequence[tuple[Resolved, int, str]]) -> tuple[list[m.Label], int]:
    """Insert or replace; the rows and how many replaced a label."""
    wanted = {(r.group.id, *r.key, labeler) for r, _, labeler in items}
    existing: dict[tuple[Any, ...], m.Label] = {}
    lb = m.Label
    group_pks = sorted({w[0] for w in wanted})
    for start in range(0, len(group_pks), 500):
        rows = s.scalars(select(lb).where(lb.tenant == tenant, lb.group_pk.in_(group_pks[start : start + 500])))
        for found in rows:
            ident = (found.group_pk, found.kind, found.rollout_id, found.turn_index, found.key_id, found.labeler)
            if ident in wanted:
                existing[ident] = found
    now = datetime.now(UTC)
    out, replaced = [], 0
    for resolved, value, labeler in items:
        ident = (resolved.group.id, *resolved.key, labeler)
        row = existing.get(ident)
        if row is None:
            kind, rollout_id, turn, name = resolved.key
            row = lb(
                tenant=tenant,
                group_pk=resolved.group.id,
                kind=kind,
                rollout_id=rollout_id,
                turn_index=turn,
                key_id=name,
                labeler=labeler,
                value=value,
                created_at=now,
                updated_at=now,
            )
            s.add(row)
            existing[ident] = row
        else:
            replaced += 1
            row.value, row.updated_at = value, now
        out.append(row)
    s.flush()
    return out, replaced


def post_label(s: Session, tenant: str, label: LabelIn) -> dict[str, Any]:
    """Store one label; the stored label and, now that it is given, the judge's answer."""
    resolved, value = _resolve(_Groups(s, tenant), label)
    [row], _ = _upsert(s, tenant, [(resolved, value, label.labeler)])
    return {**label_json(resolved.group.group_id, row), "judge": judge_answer(s, resolved)}


def import_labels(s: Session, tenant: str, labels: Sequence[LabelIn]) -> dict[str, Any]:
    """Check every label, then store them all (or none: every error named by its index)."""
    groups = _Groups(s, tenant)
    items: list[tuple[Resolved, int, str]] = []
    errors: list[FieldError] = []
    for i, label in enumerate(labels):
        at = f"labels[{i}]."
        try:
            resolved, value = _resolve(groups, label, at)
        except InvalidInput as exc:
            errors += exc.errors
            continue
        except NotFound as exc:
            errors.append(FieldError(exc.field, str(exc)))
            continue
        items.append((resolved, value, label.labeler))
    if errors:
        raise InvalidInput(errors)
    _, replaced = _upsert(s, tenant, items)
    return {"stored": len(items), "replaced": replaced}


def delete_label(s: Session, tenant: str, item: str, labeler: str) -> None:
    """Take back a label (the viewer's undo); an unknown one is 404 naming ``item_id``."""
    group_id, key = parse_item_id(item)
    groups = _Groups(s, tenant)
    group = groups.group(group_id)
    if group is None:
        raise NotFound(f"group {group_id!r} not found", "item_id")
    lb = m.Label
    kind, rollout_id, turn, name = key
    result = s.execute(
        delete(lb).where(
            lb.tenant == tenant,
            lb.group_pk == group.id,
            lb.kind == kind,
            lb.rollout_id == rollout_id,
            lb.turn_index == turn,
            lb.key_id == name,
            lb.labeler == labeler,
        )
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        raise NotFound(f"no label by {labeler!r} on this item", "item_id")


def list_labels(
    s: Session, tenant: str, group_ids: Sequence[str] | None = None, labeler: str | None = None
) -> list[dict[str, Any]]:
    """The tenant's labels (of these groups, by this labeler), ordered by group and key."""
    lb, g = m.Label, m.Group
    query = (
        select(g.group_id, lb)
        .join(g, g.id == lb.group_pk)
        .where(lb.tenant == tenant)
        .order_by(g.group_id, lb.kind, lb.rollout_id, lb.turn_index, lb.key_id, lb.labeler)
    )
    if group_ids is not None:
        found = set(s.scalars(select(g.group_id).where(g.tenant == tenant, g.group_id.in_(list(group_ids)))))
        missing = [FieldError("group_id", f"no group {gid!r}") for gid in group_ids if gid not in found]
        if missing:
            raise NotFound(missing[0].message, "group_id")
        query = query.where(g.group_id.in_(list(group_ids)))
    if labeler is not None:
        query = query.where(lb.labeler == labeler)
    return [label_json(group_id, row) for group_id, row in s.execute(query)]


def labels_of(
    s: Session, tenant: str, group_pks: Sequence[int], labelers: Sequence[str] | None = None
) -> dict[int, dict[Key, dict[str, int]]]:
    """Per group row id, per key, each labeler's value."""
    lb = m.Label
    out: dict[int, dict[Key, dict[str, int]]] = {}
    for start in range(0, len(group_pks), 500):
        query = select(lb.group_pk, lb.kind, lb.rollout_id, lb.turn_index, lb.key_id, lb.labeler, lb.value).where(
            lb.tenant == tenant, lb.group_pk.in_(list(group_pks[start : start + 500]))
        )
        if labelers is not None:
            query = query.where(lb.labeler.in_(list(labelers)))
        for group_pk, kind, rollout_id, turn, name, labeler, value in s.execute(query):
            out.setdefault(group_pk, {}).setdefault((kind, rollout_id, turn, name), {})[labeler] = value
    return out


def labeled_keys(s: Session, tenant: str, group_pks: Sequence[int], labeler: str) -> set[tuple[int, Key]]:
    """(group row id, key) of every label this labeler gave in these groups."""
    return {(group_pk, key) for group_pk, keys in labels_of(s, tenant, group_pks, [labeler]).items() for key in keys}


def judge_answer(s: Session, resolved: Resolved) -> dict[str, Any]:
    """What the judge answered at the key (shown once the label is given)."""
    kind, rollout_id, turn, name = resolved.key
    j = m.Judgment
    query = select(j).where(j.group_pk == resolved.group.id, j.kind == JUDGMENT_KIND[kind], j.rollout_id == rollout_id)
    if turn != NO_TURN:
        query = query.where(j.turn_index == turn)
    if kind in ("visit", "report_rubric"):
        query = query.where(j.rubric_id == name)
    elif kind == "citation":
        query = query.where(j.rubric_id == f"{name}:joint")
    row = s.scalars(query).first()
    out: dict[str, Any] = {"status": resolved.original.status, "value": resolved.original.value}
    if row is None:
        return out
    out["rationale"] = row.rationale
    if kind == "visit":
        out.update(page_ids=row.page_ids or [], support_points=row.support_points or [])
    elif kind == "snippet":
        out["matches"] = [x for x in row.matches or () if x.get("rubric_id") == name]
    if row.failure_reason:
        out["failure_reason"] = row.failure_reason
    return out
