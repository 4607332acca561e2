"""Which groups an audit re-scores: done groups of its scope, sampled with its seed.

Whole groups, chosen uniformly without replacement (``random.Random(seed).sample``) from
the tenant's groups in scope that are done, ordered by group id first, so the same
request samples the same groups.
"""

from __future__ import annotations

import random

from sqlalchemy import select
from sqlalchemy.orm import Session

from drcredit.audit.schemas import AuditScope
from drcredit.domain.errors import FieldError, InvalidInput
from drcredit.scoring.errors import NotFound
from drcredit.storage import models as m


def groups_in_scope(s: Session, tenant: str, scope: AuditScope) -> list[str]:
    """The done groups (public ids, sorted) of the scope; raises when the scope names
    what this tenant does not have."""
    query = select(m.Group.group_id, m.Group.status).where(m.Group.tenant == tenant)
    if scope.run is not None:
        rows = s.execute(query.where(m.Group.run == scope.run)).all()
        if not rows:
            raise NotFound(f"run {scope.run!r} not found", "scope.run")
    elif scope.batch_id is not None:
        batch = s.scalar(select(m.Batch).where(m.Batch.tenant == tenant, m.Batch.batch_id == scope.batch_id))
        if batch is None:
            raise NotFound(f"batch {scope.batch_id!r} not found", "scope.batch_id")
        rows = s.execute(query.where(m.Group.group_id.in_(list(batch.group_ids)))).all()
    else:
        wanted = list(dict.fromkeys(scope.group_ids or ()))
        rows = s.execute(query.where(m.Group.group_id.in_(wanted))).all()
        found = {gid for gid, _ in rows}
        missing = [
            FieldError(f"scope.group_ids[{i}]", f"no group {gid!r}")
            for i, gid in enumerate(scope.group_ids or ())
            if gid not in found
        ]
        if missing:
            raise InvalidInput(missing)
    return sorted(gid for gid, status in rows if status == "done")


def sample(group_ids: list[str], size: int | None, seed: int) -> list[str]:
    """``size`` of the sorted ``group_ids`` (all of them when None or larger), drawn
    uniformly without replacement with ``seed``; listed sorted."""
    ordered = sorted(group_ids)
    if size is None or size >= len(ordered):
        return ordered
    return sorted(random.Random(seed).sample(ordered, size))
