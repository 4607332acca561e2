"""Per-group scoring parameters (docs/parameters.md) and the judge-failure policy (docs/method.md, "Judge failures")."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, StrictBool, field_validator, model_validator

from drcredit.domain.numbers import BoundedNonNegative, BoundedPositive, UnitFloat

#: Parameters whose change alters what the judge is asked, so a replay cannot honour them.
JUDGMENT_PARAMETERS = frozenset({"history", "outcome_source"})


class OutcomeWeights(BaseModel):
    """Weights of the outcome reward's five components (docs/method.md, "Outcome reward"); omitted keys keep
    their defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rubric: BoundedNonNegative = 0.70
    format: BoundedNonNegative = 0.05
    search: BoundedNonNegative = 0.05
    cite: BoundedNonNegative = 0.15
    length: BoundedNonNegative = 0.05


class ScoringParams(BaseModel):
    """Every knob of the credit math; unknown names are rejected, defaults as docs/parameters.md lists them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    visit_levels: tuple[BoundedNonNegative, BoundedNonNegative, BoundedNonNegative] = (0.0, 0.2, 0.5)
    cap: BoundedPositive = 1.0
    snippet_weight: BoundedNonNegative = 0.1
    history: StrictBool = True
    navigation: StrictBool = True
    snippets: StrictBool = True
    attribution: Literal["all", "latest"] = "all"
    skip_saturated_snippets: StrictBool = True
    discount: UnitFloat = 0.0
    process_weight: BoundedNonNegative = 1.0
    outcome_on_research_turns: StrictBool = True
    on_judge_failure: Literal["zero", "fail", "exclude"] = "zero"
    #: ``given``: the trainer's ``outcome_reward``; ``judge``: the service computes it.
    outcome_source: Literal["given", "judge"] = "given"
    outcome_weights: OutcomeWeights = OutcomeWeights()
    search_cap: BoundedPositive = 5.0
    length_cap: BoundedPositive = 2000.0

    @field_validator("visit_levels", mode="before")
    @classmethod
    def _three_levels(cls, value: object) -> object:
        # pydantic would name the missing position ("visit_levels[2]: field required")
        if isinstance(value, (list, tuple)) and len(value) != 3:
            raise ValueError(
                f"must have 3 values (the credit of no, partial and full new support), got {len(value)}: {list(value)}"
            )
        return value

    @model_validator(mode="after")
    def _levels_non_decreasing(self) -> ScoringParams:
        a, b, c = self.visit_levels
        if not (a <= b <= c):
            raise ValueError(f"visit_levels must be non-decreasing, got {list(self.visit_levels)}")
        return self
