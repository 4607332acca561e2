"""The requests the clients send, built once for both: paths, bodies, ids, and whether a
retry is harmless.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, runtime_checkable
from urllib.parse import quote

#: The service's id pattern (docs/api.md): ids the client makes must be accepted as they are.
ID_PATTERN = re.compile(r"^[A-Za-z0-9\-_.:]{1,128}$")


JSONDict: TypeAlias = dict[str, Any]


@runtime_checkable
class SupportsModelDump(Protocol):
    """A pydantic model (e.g. ``drcredit.domain.group.GroupIn``), dumped to JSON before posting."""

    def model_dump(self, *, mode: str = ..., exclude_unset: bool = ...) -> dict[str, Any]: ...


Document: TypeAlias = Mapping[str, Any] | SupportsModelDump


def new_group_id(prefix: str = "") -> str:
    """A fresh id the service accepts (``[A-Za-z0-9-_.:]{1,128}``), for a group or a batch.

    Prefer ids derived from your run (``f"{run}-step{step}-q{i}"``): re-posting after a crash
    then returns the stored group instead of judging it again. Use this for one-off posts.
    """
    ident = f"{prefix}-{uuid.uuid4().hex}" if prefix else uuid.uuid4().hex
    if not ID_PATTERN.match(ident):
        raise ValueError(f"prefix {prefix!r} gives an invalid id; use at most 95 of A-Z a-z 0-9 - _ . :")
    return ident


def as_document(value: Document, what: str) -> JSONDict:
    """A JSON object from a mapping or a pydantic model.

    Models are dumped with ``exclude_unset`` so that fields left at their defaults are not
    sent and the service applies its own (e.g. the failure policy from its settings).
    """
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, SupportsModelDump):
        doc = value.model_dump(mode="json", exclude_unset=True)
        if isinstance(doc, dict):
            return doc
    raise TypeError(f"{what} must be a mapping or a pydantic model, got {type(value).__name__}")


def _segment(ident: str) -> str:
    """One URL path segment; ``.`` and ``..`` are valid ids that httpx would otherwise resolve away."""
    quoted = quote(ident, safe="-_.:~")
    return quoted.replace(".", "%2E") if ident in (".", "..") else quoted


def _pick_id(in_document: Any, argument: str | None, name: str) -> str:
    if argument is not None and in_document is not None and in_document != argument:
        raise ValueError(f"{name} {argument!r} differs from the document's {in_document!r}")
    chosen = argument if argument is not None else in_document
    if chosen is None:
        return new_group_id()
    if not isinstance(chosen, str):
        raise TypeError(f"{name} must be a string, got {type(chosen).__name__}")
    return chosen


@dataclass(frozen=True)
class Call:
    """One request: ``retry`` says whether sending it twice is harmless."""

    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    retry: bool = True
    wait: float = 0.0
    accept: tuple[int, ...] = ()
    text: bool = False


def _params(params: Document | None) -> JSONDict:
    return {} if params is None else as_document(params, "params")


def with_run(metadata: Any, run: str | None, step: int | None) -> Any:
    """``metadata`` with the documented ``run`` and ``step`` keys set (the viewer files the
    group under them)."""
    if run is None and step is None:
        return metadata
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError("metadata must be a mapping when run or step is given")
    merged = dict(metadata or {})
    if run is not None:
        merged["run"] = run
    if step is not None:
        merged["step"] = step
    return merged


def submit_group(
    group: Document,
    group_id: str | None,
    params: Document | None,
    metadata: Any,
    run: str | None = None,
    step: int | None = None,
) -> Call:
    doc = as_document(group, "group")
    doc["group_id"] = _pick_id(doc.get("group_id"), group_id, "group_id")
    if params is not None:
        doc["params"] = _params(params)
    metadata = with_run(metadata if metadata is not None else doc.get("metadata"), run, step)
    if metadata is not None:
        doc["metadata"] = metadata
    return Call("POST", "/v1/groups", json=doc, retry=True)


def open_group(
    question: str,
    rubrics: Iterable[Document],
    expected_rollouts: int,
    group_id: str | None,
    rollouts: Iterable[Document],
    params: Document | None,
    metadata: Any,
    run: str | None = None,
    step: int | None = None,
) -> Call:
    metadata = with_run(metadata, run, step)
    doc: JSONDict = {
        "group_id": _pick_id(None, group_id, "group_id"),
        "question": question,
        "rubrics": [as_document(r, "rubric") for r in rubrics],
        "rollouts": [as_document(r, "rollout") for r in rollouts],
        "expected_rollouts": expected_rollouts,
    }
    if params is not None:
        doc["params"] = _params(params)
    if metadata is not None:
        doc["metadata"] = metadata
    return Call("POST", "/v1/groups", json=doc, retry=True)


def add_rollout(group_id: str, rollout: Document) -> Call:
    doc = as_document(rollout, "rollout")
    # Idempotent on the rollout id, so a retry is safe exactly when there is one.
    return Call("POST", f"/v1/groups/{_segment(group_id)}/rollouts", json=doc, retry=doc.get("id") is not None)


def submit_batch(
    groups: Iterable[Document], batch_id: str | None, run: str | None = None, step: int | None = None
) -> Call:
    """Every group gets an id before the first attempt: a retried POST is then the same
    batch of the same groups, never a second copy judged again."""
    documents = [as_document(g, "group") for g in groups]
    for doc in documents:
        if doc.get("group_id") is None:
            doc["group_id"] = new_group_id()
        if run is not None or step is not None:
            doc["metadata"] = with_run(doc.get("metadata"), run, step)
    return Call(
        "POST", "/v1/batches", json={"batch_id": _pick_id(None, batch_id, "batch_id"), "groups": documents}, retry=True
    )


def group_status(group_id: str) -> Call:
    return Call("GET", f"/v1/groups/{_segment(group_id)}")


def batch_status(batch_id: str) -> Call:
    return Call("GET", f"/v1/batches/{_segment(batch_id)}")


def _waiting(path: str, wait: float | None) -> Call:
    if wait is None:
        return Call("GET", path)
    if wait < 0 or math.isnan(wait):
        raise ValueError("wait must be a non-negative number of seconds")
    return Call("GET", path, params={"wait": wait}, wait=wait)


def advantages(group_id: str, wait: float | None) -> Call:
    return _waiting(f"/v1/groups/{_segment(group_id)}/advantages", wait)


def batch_advantages(batch_id: str, wait: float | None) -> Call:
    return _waiting(f"/v1/batches/{_segment(batch_id)}/advantages", wait)


def credits(group_id: str, wait: float | None) -> Call:
    return _waiting(f"/v1/groups/{_segment(group_id)}/credits", wait)


def replay(group_id: str, params: Document | None) -> Call:
    # Recomputes from stored judgments with no judge call: repeating it is harmless.
    return Call("POST", f"/v1/groups/{_segment(group_id)}/replay", json={"params": _params(params)}, retry=True)


def healthz() -> Call:
    return Call("GET", "/healthz")


def readyz() -> Call:
    # 503 is an answer here (which check failed), not a fault to retry.
    return Call("GET", "/readyz", accept=(503,))


def metrics() -> Call:
    return Call("GET", "/metrics", text=True)


def start_audit(
    judge: str,
    run: str | None,
    batch_id: str | None,
    group_ids: Iterable[str] | None,
    sample_groups: int | None,
    seed: int,
    labelers: Iterable[str] | None = None,
) -> Call:
    """The scope is whichever of ``run``, ``batch_id``, ``group_ids`` is given; the service
    checks that exactly one is (a ``422`` naming ``scope``). Never retried: each POST starts
    another audit, which calls the audit judge again."""
    body: JSONDict = {"judge": judge, "scope": _scope(run, batch_id, group_ids), "seed": seed}
    if sample_groups is not None:
        body["sample_groups"] = sample_groups
    if labelers is not None:
        body["labelers"] = _names(labelers, "labelers")
    return Call("POST", "/v1/audits", json=body, retry=False)


def _names(values: Iterable[str], what: str) -> list[str]:
    if isinstance(values, str):
        raise TypeError(f"{what} must be a list, not one string")
    return list(values)


def _scope(run: str | None, batch_id: str | None, group_ids: Iterable[str] | None) -> JSONDict:
    scope: JSONDict = {}
    if run is not None:
        scope["run"] = run
    if batch_id is not None:
        scope["batch_id"] = batch_id
    if group_ids is not None:
        scope["group_ids"] = _names(group_ids, "group_ids")
    return scope


def label_queue(
    labeler: str,
    run: str | None,
    batch_id: str | None,
    group_ids: Iterable[str] | None,
    kind: str | Iterable[str] | None,
    n: int,
    seed: int,
) -> Call:
    params: JSONDict = {"labeler": labeler, "n": n, "seed": seed, **_scope(run, batch_id, group_ids)}
    if "group_ids" in params:
        params["group_ids"] = ",".join(params["group_ids"])
    if kind is not None:
        params["kind"] = kind if isinstance(kind, str) else ",".join(kind)
    return Call("GET", "/v1/labels/queue", params=params)


def post_label(
    value: int,
    labeler: str,
    item_id: str | None,
    group_id: str | None,
    kind: str | None,
    key: Mapping[str, Any] | None,
) -> Call:
    # Posting the same label again stores the same value: harmless to retry.
    body: JSONDict = {"value": value, "labeler": labeler}
    for name, given in (("item_id", item_id), ("group_id", group_id), ("kind", kind), ("key", key)):
        if given is not None:
            body[name] = dict(given) if isinstance(given, Mapping) else given
    return Call("POST", "/v1/labels", json=body, retry=True)


def import_labels(labels: Iterable[Mapping[str, Any]]) -> Call:
    # All or nothing, and a label given again replaces itself: harmless to retry.
    return Call("POST", "/v1/labels/import", json={"labels": [dict(x) for x in labels]}, retry=True)


def labels(group_ids: Iterable[str] | None, labeler: str | None) -> Call:
    params: JSONDict = {}
    if group_ids is not None:
        params["group_id"] = _names(group_ids, "group_ids")
    if labeler is not None:
        params["labeler"] = labeler
    return Call("GET", "/v1/labels", params=params or None)


def delete_label(item_id: str, labeler: str) -> Call:
    # A second delete answers 404: not retried.
    return Call("DELETE", f"/v1/labels/{_segment(item_id)}", params={"labeler": labeler}, retry=False, text=True)


def audit(audit_id: str, wait: float | None) -> Call:
    return _waiting(f"/v1/audits/{_segment(audit_id)}", wait)


def audits(run: str | None) -> Call:
    return Call("GET", "/v1/audits", params=None if run is None else {"run": run})
