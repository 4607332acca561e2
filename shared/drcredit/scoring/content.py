"""Canonical hashing and (de)serialization of what the database stores of a group."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import TypeAdapter

from drcredit.domain.group import GroupContent, GroupIn, Rubric
from drcredit.domain.params import ScoringParams
from drcredit.storage import models

_RUBRICS = TypeAdapter(list[Rubric])


def canonical_hash(value: Any) -> str:
    """SHA-256 of the value's canonical JSON (sorted keys, compact, UTF-8)."""
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True)
class Dumped:
    """A group's rollouts as JSON documents, dumped once for hashing and storage."""

    rollouts: dict[str, dict[str, Any]]

    @classmethod
    def of(cls, group: GroupContent | GroupIn) -> Dumped:
        return cls({r.id: r.model_dump(mode="json") for r in group.rollouts})

    def rollout_hash(self, rollout_id: str) -> str:
        return canonical_hash(self.rollouts[rollout_id])


def group_hash(group: GroupIn, dumped: Dumped | None = None) -> str:
    """What makes two posts of one ``group_id`` the same group (metadata is not scored)."""
    dumped = dumped or Dumped.of(group)
    return canonical_hash(
        {
            "question": group.question,
            "rubrics": [r.model_dump(mode="json") for r in group.rubrics],
            "rollouts": [dumped.rollouts[r.id] for r in group.rollouts],
            "params": group.params.model_dump(mode="json"),
            "expected_rollouts": group.expected_rollouts,
        }
    )


def params_of(row: models.Group) -> ScoringParams:
    return ScoringParams.model_validate(row.params)


def content_of(row: models.Group) -> GroupContent:
    """Rebuild the validated group content from its rows (loaded with their turn bodies)."""
    return GroupContent.model_validate(
        {
            "question": row.question,
            "rubrics": row.rubrics,
            "rollouts": [
                {"id": r.rollout_id, "outcome_reward": r.outcome_reward, "turns": [t.body for t in r.turns]}
                for r in row.rollouts
            ],
        }
    )


def rubrics_of(row: models.Group) -> list[Rubric]:
    return _RUBRICS.validate_python(row.rubrics)
