"""Canonical hashing and (de)serialization of what the database stores of a group."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import TypeAdapter

from drcredit.domain.group import GroupContent, GroupIn, Rollout, Rubric
from drcredit.domain.params import ScoringParams
from drcredit.storage import models

_RUBRICS = TypeAdapter(list[Rubric])


def canonical_hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def group_hash(group: GroupIn) -> str:
    """What makes two posts of one ``group_id`` the same group (metadata is not scored)."""
    return canonical_hash(
        {
            "question": group.question,
            "rubrics": [r.model_dump(mode="json") for r in group.rubrics],
            "rollouts": [r.model_dump(mode="json") for r in group.rollouts],
            "params": group.params.model_dump(mode="json"),
            "expected_rollouts": group.expected_rollouts,
        }
    )


def rollout_hash(rollout: Rollout) -> str:
    return canonical_hash(rollout.model_dump(mode="json"))


def params_of(row: models.Group) -> ScoringParams:
    return ScoringParams.model_validate(row.params)


def content_of(row: models.Group, rollouts: list[models.Rollout] | None = None) -> GroupContent:
    """Rebuild the validated group content from its rows."""
    rows = row.rollouts if rollouts is None else rollouts
    return GroupContent.model_validate(
        {
            "question": row.question,
            "rubrics": row.rubrics,
            "rollouts": [
                {"id": r.rollout_id, "outcome_reward": r.outcome_reward, "turns": [t.body for t in r.turns]}
                for r in rows
            ],
        }
    )


def rubrics_of(row: models.Group) -> list[Rubric]:
    return _RUBRICS.validate_python(row.rubrics)
