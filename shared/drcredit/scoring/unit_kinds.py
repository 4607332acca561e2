"""Every kind of work unit, by the name stored in ``work_units.kind``.

A kind is one module with one coroutine, ``run(ctx, unit, owner) -> UnitOutcome``
(:mod:`~drcredit.scoring.unit_context` says what it may use). Adding a kind is that
module, its entry here, and the rows ingest plans for it (:mod:`drcredit.scoring.planning`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from drcredit.scoring.outcome_unit import run_outcome_unit
from drcredit.scoring.snippet_unit import run_snippet
from drcredit.scoring.unit_context import UnitContext
from drcredit.scoring.units import Claimed, UnitOutcome
from drcredit.scoring.visit_chain import run_visit_chain

UnitRunner = Callable[[UnitContext, Claimed, str], Awaitable[UnitOutcome]]

UNIT_KINDS: dict[str, UnitRunner] = {
    "visit_chain": run_visit_chain,
    "snippet": run_snippet,
    "outcome": run_outcome_unit,
}
