"""The statements of the judging hot path: claiming units, finishing them, releasing
waiting snippet calls, counting progress, locking group rows.

Every judge call passes through a claim and a batch write, each a transaction of a few
statements. Built with SQLAlchemy Core, each statement cost the worker 200-500 us of
CPU (construction, cache key, parameters, results) on top of a 40 us round trip, and
IN lists of every length made Postgres parse and plan each statement anew: together
more CPU than the judge call itself (BENCHMARKS.md). On Postgres these statements are
therefore constant SQL run on the session's own driver connection, so psycopg prepares
each once per connection; lists travel as arrays. Other databases (SQLite, embedded
mode) take the same statements as SQLAlchemy Core. Callers pass the session whose
transaction the statement joins; the decisions stay with the caller.
"""

from drcredit.storage.repository.groups import (
    add_units_done,
    finish_group,
    flip_aggregation,
    group_headers,
    group_states,
    lock_groups,
    start_groups,
)
from drcredit.storage.repository.results import (
    TURN_RESULTS,
    GroupForAggregation,
    group_for_aggregation,
    judgment_outcomes,
    outcome_facts,
    rollout_document,
    rollout_documents,
    rollout_outlines,
    store_results,
    turn_ids,
)
from drcredit.storage.repository.units import (
    RolloutKey,
    UnitState,
    finish_units,
    release_waiting,
    start_units,
    units_for_claim,
    visit_levels,
    waiting_snippets,
)

__all__ = [
    "TURN_RESULTS",
    "GroupForAggregation",
    "RolloutKey",
    "UnitState",
    "add_units_done",
    "finish_group",
    "finish_units",
    "flip_aggregation",
    "group_for_aggregation",
    "group_headers",
    "group_states",
    "judgment_outcomes",
    "lock_groups",
    "outcome_facts",
    "release_waiting",
    "rollout_document",
    "rollout_documents",
    "rollout_outlines",
    "start_groups",
    "start_units",
    "store_results",
    "turn_ids",
    "units_for_claim",
    "visit_levels",
    "waiting_snippets",
]
