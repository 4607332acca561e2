"""A training step's groups posted in one call (docs/api.md, ``POST /v1/batches``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from drcredit.domain.group import GroupId, GroupIn


class BatchIn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_id: GroupId | None = None
    groups: list[GroupIn] = Field(min_length=1, max_length=10_000)

    @model_validator(mode="after")
    def _unique_group_ids(self) -> BatchIn:
        seen: dict[str, int] = {}
        problems = []
        for i, group in enumerate(self.groups):
            if group.group_id is None:
                continue
            if group.group_id in seen:
                problems.append(
                    (
                        f"groups[{i}].group_id",
                        f"duplicate group id {group.group_id} (first at groups[{seen[group.group_id]}])",
                    )
                )
            else:
                seen[group.group_id] = i
        if problems:
            raise PydanticCustomError(
                "invalid_batch", "; ".join(f"{f}: {d}" for f, d in problems), {"semantic": problems}
            )
        return self
