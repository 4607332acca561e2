"""Labels from people (docs/audit.md, "Labels from people"): a labeler's queue of the
judge's judgments (what the judge saw, never its answer), labels given one at a time or
imported all together, listed and taken back. Tenant-scoped like every ``/v1`` route."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from drcredit.audit.labels import queue as label_queue
from drcredit.audit.labels import store
from drcredit.audit.labels.schemas import LABELER_PATTERN, LabelImport, LabelIn
from drcredit.audit.schemas import AuditScope
from drcredit.domain.errors import FieldError, InvalidInput
from drcredit.domain.text import Text
from drcredit_api.endpoints import INGEST, READ, RESULT, RuntimeDep, Tenant, read_db
from drcredit_api.schemas import Open

router = APIRouter(tags=["labels"])

#: Query text is checked like every stored text (no NUL, no lone surrogate): refused
#: with a 422 naming the parameter instead of failing in the database.
Labeler = Annotated[
    Text,
    Query(
        min_length=1,
        max_length=128,
        pattern=LABELER_PATTERN,
        description="Who labels (the queue leaves out what they labeled)",
    ),
]


class QueueItem(Open):
    item_id: str
    group_id: str
    kind: str
    key: dict[str, Any]
    #: What the judge saw: the question, the rubric, the support already credited and the
    #: pages; or the snippets; or the report; or the claim and its pages.
    shown: dict[str, Any]


class LabelQueue(Open):
    labeler: str
    kinds: list[str]
    #: Judgments of the scope this labeler could still label (the sample's population).
    available: int
    items: list[QueueItem]


class Label(Open):
    item_id: str
    group_id: str
    kind: str
    key: dict[str, Any]
    value: int
    labeler: str
    created_at: str
    updated_at: str


class StoredLabel(Label):
    #: The judge's own answer at the key, shown now that the label is given.
    judge: dict[str, Any]


class LabelList(Open):
    labels: list[Label]


class Imported(Open):
    stored: int
    replaced: int


@router.get("/v1/labels/queue", response_model=LabelQueue, responses=RESULT)
async def label_queue_of(
    tenant: Tenant,
    rt: RuntimeDep,
    labeler: Labeler,
    run: Annotated[Text | None, Query(min_length=1, max_length=128)] = None,
    batch_id: Annotated[Text | None, Query(min_length=1, max_length=128)] = None,
    group_ids: Annotated[list[Text] | None, Query(description="Group ids (repeated, or separated by commas)")] = None,
    kind: Annotated[
        Text | None, Query(description="visit | snippet | report_rubric | citation (several: commas; all: leave out)")
    ] = None,
    n: Annotated[int, Query(ge=1, le=500)] = 20,
    seed: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
) -> dict[str, Any]:
    """A sample of ``n`` judgments of the scope's done groups that ``labeler`` has not
    labeled (failed ones are never offered), each with what the judge saw."""
    ids = [g for raw in group_ids or () for g in raw.split(",") if g] or None
    given = [name for name, v in (("run", run), ("batch_id", batch_id), ("group_ids", ids)) if v is not None]
    if len(given) != 1:
        raise InvalidInput(
            [FieldError("run", f"give exactly one of run, batch_id, group_ids (got {', '.join(given) or 'none'})")]
        )
    scope = AuditScope(run=run, batch_id=batch_id, group_ids=ids)
    kinds = label_queue.parse_kinds(kind)
    return await read_db(rt, lambda s: label_queue.queue(s, tenant, scope, kinds, n, seed, labeler))


@router.post("/v1/labels", status_code=201, response_model=StoredLabel, responses=INGEST | READ)
async def post_label(label: LabelIn, tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """Store a label (the same labeler's earlier label on the key is replaced); the answer
    carries the judge's own answer at the key."""
    return await read_db(rt, lambda s: store.post_label(s, tenant, label), writes=True)


@router.post("/v1/labels/import", status_code=201, response_model=Imported, responses=INGEST)
async def import_labels(body: LabelImport, tenant: Tenant, rt: RuntimeDep) -> dict[str, Any]:
    """Store many labels at once: all of them, or, when any is refused, none (every
    refusal named ``labels[i].field``)."""
    return await read_db(rt, lambda s: store.import_labels(s, tenant, body.labels), writes=True)


@router.get("/v1/labels", response_model=LabelList, responses=READ)
async def list_labels(
    tenant: Tenant,
    rt: RuntimeDep,
    group_id: Annotated[list[Text] | None, Query(description="Only these groups' labels (repeated)")] = None,
    labeler: Annotated[Text | None, Query(min_length=1, max_length=128, pattern=LABELER_PATTERN)] = None,
) -> dict[str, Any]:
    """The tenant's labels, by group and key."""
    return {"labels": await read_db(rt, lambda s: store.list_labels(s, tenant, group_id, labeler))}


@router.delete("/v1/labels/{item_id}", status_code=204, responses=READ)
async def delete_label(item_id: str, tenant: Tenant, rt: RuntimeDep, labeler: Labeler) -> Response:
    """Take back ``labeler``'s label on the item (the labeling page's undo)."""
    await read_db(rt, lambda s: store.delete_label(s, tenant, item_id, labeler), writes=True)
    return Response(status_code=204)
