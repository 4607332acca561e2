"""What a tenant may ask of an audit: a judge by name, a scope, a sample size and a seed."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from drcredit.domain.group import GroupId
from drcredit.domain.text import Text


class AuditScope(BaseModel):
    """Exactly one of: a training run, a batch, or a list of groups."""

    model_config = ConfigDict(extra="forbid")

    run: Text | None = Field(None, min_length=1, max_length=128)
    batch_id: Text | None = Field(None, min_length=1, max_length=128)
    group_ids: list[GroupId] | None = Field(None, min_length=1, max_length=10_000)

    @model_validator(mode="after")
    def _exactly_one(self) -> AuditScope:
        given = [name for name in ("run", "batch_id", "group_ids") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of run, batch_id, group_ids (got {', '.join(given) or 'none'})")
        return self


#: The judge name of an audit against people's labels (never an operator's judge).
HUMAN = "human"


class AuditRequest(BaseModel):
    """``POST /v1/audits``: re-score ``sample_groups`` done groups of ``scope`` (all of
    them when left out) with the audit judge ``judge``, chosen with ``seed``; with
    ``judge: "human"``, compare with the labels of ``labelers`` (every labeler's when
    left out) on the labeled groups of the scope instead."""

    model_config = ConfigDict(extra="forbid")

    judge: str = Field(min_length=1, max_length=128)
    scope: AuditScope
    sample_groups: int | None = Field(None, ge=1, le=10_000)
    seed: int = Field(0, ge=0, le=2**63 - 1)
    labelers: list[str] | None = Field(None, min_length=1, max_length=1000)

    @field_validator("labelers")
    @classmethod
    def _labelers_with_people(cls, labelers: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if labelers is not None and info.data.get("judge") != HUMAN:
            raise ValueError(f'only an audit with "judge": "{HUMAN}" compares with labels')
        return labelers
