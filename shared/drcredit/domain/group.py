"""The rollout group a trainer posts (docs/method.md, "Input"), with every structural check.

Field-level problems are pydantic errors; cross-field problems (duplicate ids, an
``answer`` that is not last, ...) are collected by :func:`group_problems` and raised
from a model validator with their full paths, so callers see one uniform error list.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic_core import PydanticCustomError

from drcredit.domain.errors import FieldError
from drcredit.domain.numbers import FiniteFloat
from drcredit.domain.params import ScoringParams
from drcredit.domain.text import FreeJSON, Text, storable

Id = Annotated[str, StringConstraints(min_length=1, max_length=256), AfterValidator(storable)]
GROUP_ID_PATTERN = r"^[A-Za-z0-9\-_.:]{1,128}$"


_GROUP_ID_RE = re.compile(GROUP_ID_PATTERN)


def _group_id(value: str) -> str:
    """An id that is one URL path segment, said in words rather than as the regex."""
    if not _GROUP_ID_RE.match(value):
        raise ValueError(f"must be 1-128 characters, each a letter, digit, '-', '_', '.' or ':' (got {value!r})")
    # "." and ".." fit the character set but are path segments that HTTP clients resolve
    # away (/v1/groups/.. is /v1), so such a group could never be read back.
    if value.strip(".") == "":
        raise ValueError(f"must not consist of dots only, got {value!r}")
    return value


GroupId = Annotated[
    str,
    StringConstraints(strict=True),
    Field(json_schema_extra={"pattern": GROUP_ID_PATTERN}),
    AfterValidator(_group_id),
]


class _Model(BaseModel):
    # Unknown fields are rejected, naming their path: a misspelled ``outcome_reward`` or
    # ``pages`` silently ignored would change the scores. ``metadata`` is the one free
    # place for a trainer's own bookkeeping.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rubric(_Model):
    id: Id
    type: Literal["factual", "logical"]
    description: Text
    weight: FiniteFloat
    trusted_evidence: list[Text] = Field(default_factory=list)

    @property
    def positive(self) -> bool:
        """Only positive-weight rubrics take part in process credit (docs/method.md, "Input")."""
        return self.weight > 0


class SearchCall(_Model):
    queries: list[Text] = Field(default_factory=list)


class SearchResult(_Model):
    id: Id
    url: Text
    title: Text = ""
    snippet: Text = ""


class SearchTurn(_Model):
    type: Literal["search"]
    reasoning: Text = ""
    call: SearchCall = Field(default_factory=SearchCall)
    results: list[SearchResult] = Field(default_factory=list)
    error: Text | None = None


class VisitCall(_Model):
    urls: list[Text] = Field(default_factory=list)
    goal: Text = ""


class Page(_Model):
    id: Id
    url: Text = ""
    evidence: Text | None = None
    summary: Text | None = None
    error: Text | None = None

    @property
    def usable(self) -> bool:
        return page_usable(self.error, self.evidence)


def page_usable(error: str | None, evidence: str | None) -> bool:
    """A page with no error and non-blank evidence (docs/method.md, "Visit credit")."""
    return not error and bool(evidence and evidence.strip())


class VisitTurn(_Model):
    type: Literal["visit"]
    reasoning: Text = ""
    call: VisitCall = Field(default_factory=VisitCall)
    pages: list[Page] = Field(default_factory=list)

    @property
    def usable_pages(self) -> list[Page]:
        return [p for p in self.pages if p.usable]


class AnswerTurn(_Model):
    type: Literal["answer"]
    reasoning: Text = ""
    answer: Text = ""


class ToolTurn(_Model):
    type: Literal["tool"]
    reasoning: Text = ""
    name: Text = ""
    arguments: FreeJSON = None
    response: FreeJSON = None


Turn = Annotated[SearchTurn | VisitTurn | AnswerTurn | ToolTurn, Field(discriminator="type")]


class Rollout(_Model):
    id: Id
    outcome_reward: FiniteFloat | None = None
    turns: list[Turn] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> Rollout:
        _raise(list(rollout_problems(self)))
        return self

    @property
    def non_final_indices(self) -> list[int]:
        """Indices of every turn but a trailing ``answer``."""
        n = len(self.turns)
        if n and isinstance(self.turns[-1], AnswerTurn):
            n -= 1
        return list(range(n))


class GroupContent(_Model):
    """What is scored: the question, its rubrics and the rollouts (docs/method.md, "Input")."""

    question: Text
    rubrics: list[Rubric] = Field(min_length=1)
    rollouts: list[Rollout] = Field(default_factory=list)

    @property
    def positive_rubrics(self) -> list[Rubric]:
        return [r for r in self.rubrics if r.positive]

    def rollout(self, rollout_id: str) -> Rollout:
        for r in self.rollouts:
            if r.id == rollout_id:
                return r
        raise KeyError(rollout_id)


class GroupIn(GroupContent):
    """A group as posted: content plus ingest options (docs/api.md)."""

    group_id: GroupId | None = None
    params: ScoringParams = Field(default_factory=ScoringParams)
    metadata: FreeJSON = None
    expected_rollouts: int | None = Field(default=None, ge=2, le=4096)

    @field_validator("metadata")
    @classmethod
    def _check_run(cls, metadata: Any) -> Any:
        _raise(list(run_problems(metadata)), relative=True)
        return metadata

    @field_validator("rubrics")
    @classmethod
    def _check_rubrics(cls, rubrics: list[Rubric]) -> list[Rubric]:
        _raise(list(rubric_problems(rubrics)), relative=True)
        return rubrics

    @field_validator("rollouts")
    @classmethod
    def _check_rollouts(cls, rollouts: list[Rollout]) -> list[Rollout]:
        _raise(list(rollout_set_problems(rollouts)), relative=True)
        return rollouts

    @model_validator(mode="after")
    def _check(self) -> GroupIn:
        _raise(list(group_problems(self)))
        return self

    @property
    def streaming(self) -> bool:
        return self.expected_rollouts is not None


#: The documented keys of ``metadata`` that place a group in a training run (analytics).
RUN_KEY, STEP_KEY = "run", "step"


def run_problems(metadata: Any) -> Iterator[FieldError]:
    """``metadata.run`` is a name of 1-128 characters, ``metadata.step`` an integer >= 0."""
    if not isinstance(metadata, dict):
        return
    run, step = metadata.get(RUN_KEY), metadata.get(STEP_KEY)
    if run is not None and not (isinstance(run, str) and 1 <= len(run) <= 128):
        yield FieldError("metadata.run", f"must be a string of 1 to 128 characters, got {run!r:.60}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63):
        yield FieldError("metadata.step", f"must be an integer >= 0, got {step!r:.60}")


def run_and_step(metadata: Any) -> tuple[str | None, int | None]:
    """The run and step a group's (validated) metadata places it in."""
    if not isinstance(metadata, dict):
        return None, None
    return metadata.get(RUN_KEY), metadata.get(STEP_KEY)


def _raise(problems: list[FieldError], *, relative: bool = False) -> None:
    """Raise the problems as one pydantic error whose context lists every path.

    ``relative`` problems come from a field validator, whose location pydantic already
    knows, so their paths drop the field name (``rollouts[1].id`` becomes ``[1].id``).
    """
    if problems:
        raise PydanticCustomError(
            "invalid_group",
            "; ".join(str(p) for p in problems),
            {"semantic": [(_relative(p.field) if relative else p.field, p.message) for p in problems]},
        )


def _relative(field: str) -> str:
    cuts = [i for i in (field.find("["), field.find(".")) if i >= 0]
    return field[min(cuts) :].lstrip(".") if cuts else ""


def rollout_problems(rollout: Rollout) -> Iterator[FieldError]:
    """Cross-field checks inside one rollout; paths are relative to the rollout."""
    results: dict[str, str] = {}
    pages: dict[str, str] = {}
    for t, turn in enumerate(rollout.turns):
        if isinstance(turn, AnswerTurn) and t != len(rollout.turns) - 1:
            yield FieldError(
                f"turns[{t}].type",
                f"an answer turn must be the last turn (found at {t} of {len(rollout.turns)})",
            )
        if isinstance(turn, SearchTurn):
            for j, res in enumerate(turn.results):
                here = f"turns[{t}].results[{j}].id"
                if res.id in results:
                    yield FieldError(here, f"duplicate result id {res.id} (first at {results[res.id]})")
                else:
                    results[res.id] = here
        elif isinstance(turn, VisitTurn):
            for j, page in enumerate(turn.pages):
                here = f"turns[{t}].pages[{j}].id"
                if page.id in pages:
                    yield FieldError(here, f"duplicate page id {page.id} (first at {pages[page.id]})")
                else:
                    pages[page.id] = here


def rubric_problems(rubrics: list[Rubric]) -> Iterator[FieldError]:
    """Unique rubric ids and at least one positive weight."""
    seen: dict[str, int] = {}
    for k, rubric in enumerate(rubrics):
        if rubric.id in seen:
            yield FieldError(
                f"rubrics[{k}].id", f"duplicate rubric id {rubric.id} (first at rubrics[{seen[rubric.id]}])"
            )
        else:
            seen[rubric.id] = k
    if rubrics and not any(r.positive for r in rubrics):
        yield FieldError("rubrics", "no rubric has a positive weight; process credit needs at least one")


def group_problems(group: GroupIn) -> Iterator[FieldError]:
    """Cross-field checks over the whole group; paths are relative to the group."""
    n = len(group.rollouts)
    if group.expected_rollouts is None:
        if n < 2:
            yield FieldError(
                "rollouts", f"a group needs at least 2 rollouts, got {n} (or set expected_rollouts to stream them)"
            )
    elif n > group.expected_rollouts:
        yield FieldError("rollouts", f"{n} rollouts exceed expected_rollouts={group.expected_rollouts}")
    if group.params.outcome_source == "judge":
        for i, rollout in enumerate(group.rollouts):
            if rollout.outcome_reward is not None:
                yield judged_reward_given(f"rollouts[{i}].outcome_reward")
    else:
        yield from outcome_reward_problems(group.rollouts)


def judged_reward_given(field: str) -> FieldError:
    """With ``outcome_source: judge`` the service computes the reward (docs/method.md, "Outcome reward")."""
    return FieldError(
        field, "must not be given with params.outcome_source 'judge': the service computes the outcome reward"
    )


def rollout_set_problems(rollouts: list[Rollout], offset: int = 0) -> Iterator[FieldError]:
    """Rollout ids unique within the group."""
    ids: dict[str, int] = {}
    for i, rollout in enumerate(rollouts):
        if rollout.id in ids:
            yield FieldError(
                f"rollouts[{i + offset}].id",
                f"duplicate rollout id {rollout.id} (first at rollouts[{ids[rollout.id]}])",
            )
        else:
            ids[rollout.id] = i + offset


def outcome_reward_problems(rollouts: list[Rollout], offset: int = 0) -> Iterator[FieldError]:
    """``outcome_reward`` is optional for the group as a whole, not per rollout.

    A group where some rollouts carry a reward and others do not cannot be normalized
    (the outcome advantage needs all G rewards, docs/method.md, "Advantages"), so the missing ones are named. A group with no
    rewards at all is scored process-only with a zero outcome advantage.
    """
    have = [r.outcome_reward is not None for r in rollouts]
    if any(have) and not all(have):
        for i, rollout in enumerate(rollouts):
            if rollout.outcome_reward is None:
                yield FieldError(
                    f"rollouts[{i + offset}].outcome_reward",
                    "missing; every rollout of the group needs an outcome_reward when any has one",
                )


def is_valid_group_id(value: str) -> bool:
    return bool(_GROUP_ID_RE.match(value))
