"""What a label is on the wire: the judgment it names, its value, who gave it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from drcredit.domain.text import Text

#: A labeler's name: what the queue, the audit and the documents call that person.
LABELER_PATTERN = r"^[^\x00-\x1f]+$"
LABELER = Field(min_length=1, max_length=128, pattern=LABELER_PATTERN)


class LabelIn(BaseModel):
    """``POST /v1/labels``: ``item_id`` (from the queue) or ``group_id``, ``kind`` and
    ``key`` name the judgment; ``value`` lies in the kind's categories (visit 0-2,
    snippet 0/1, report_rubric 0-4, citation 0-2)."""

    model_config = ConfigDict(extra="forbid")

    item_id: Text | None = Field(None, max_length=2048)
    group_id: Text | None = Field(None, min_length=1, max_length=128)
    kind: str | None = Field(None, description="visit | snippet | report_rubric | citation")
    key: dict[str, Any] | None = Field(
        None,
        description='visit, snippet: {"rollout_id", "turn_index", "rubric_id"}; report_rubric: '
        '{"rollout_id", "rubric_id"}; citation: {"rollout_id", "claim"}',
    )
    value: StrictInt
    labeler: str = LABELER


class LabelImport(BaseModel):
    """``POST /v1/labels/import``: many labels, stored all together or not at all."""

    model_config = ConfigDict(extra="forbid")

    labels: list[LabelIn] = Field(min_length=1, max_length=100_000)
