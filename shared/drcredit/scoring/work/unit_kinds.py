"""Every kind of work unit, by the name stored in ``work_units.kind``.

A kind is one module with one coroutine, ``run(ctx, unit, owner) -> UnitOutcome``
(:mod:`~drcredit.scoring.work.unit_context` says what it may use). Adding a kind is that
module, its entry here, and the rows ingest plans for it (:mod:`drcredit.scoring.intake.planning`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from drcredit.scoring.work.outcome_unit import run_outcome_unit
from drcredit.scoring.work.snippet_unit import run_snippet
from drcredit.scoring.work.unit_context import UnitContext
from drcredit.scoring.work.units import Claimed, UnitOutcome
from drcredit.scoring.work.visit_chain import run_visit_chain

UnitRunner = Callable[[UnitContext, Claimed, str], Awaitable[UnitOutcome]]

UNIT_KINDS: dict[str, UnitRunner] = {
    "visit_chain": run_visit_chain,
    "snippet": run_snippet,
    "outcome": run_outcome_unit,
}
