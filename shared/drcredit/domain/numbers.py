"""Strict numeric field types shared by the input model and the parameters."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BeforeValidator, Field


def _strict_number(value: Any) -> Any:
    # JSON booleans and numeric strings are almost always a client bug: refuse them
    # instead of letting pydantic's lax mode coerce True into 1.0.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        digits = len(str(abs(value))) if isinstance(value, int) else 0
        raise ValueError(f"must be a finite number; this {digits}-digit integer does not fit a float") from None
    if not math.isfinite(number):
        raise ValueError(f"must be a finite number, got {value!r}")
    return number


FiniteFloat = Annotated[float, BeforeValidator(_strict_number)]
NonNegativeFloat = Annotated[float, BeforeValidator(_strict_number), Field(ge=0.0)]
PositiveFloat = Annotated[float, BeforeValidator(_strict_number), Field(gt=0.0)]
UnitFloat = Annotated[float, BeforeValidator(_strict_number), Field(ge=0.0, le=1.0)]

#: Parameters are scores and weights of order one; a bound far above any sensible value
#: keeps sums of them finite.
PARAMETER_MAX = 1e6
BoundedNonNegative = Annotated[float, BeforeValidator(_strict_number), Field(ge=0.0, le=PARAMETER_MAX)]
BoundedPositive = Annotated[float, BeforeValidator(_strict_number), Field(gt=0.0, le=PARAMETER_MAX)]
