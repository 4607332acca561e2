"""Queue and task names: one queue per service, so each scales on its own backlog."""

from __future__ import annotations

VISIT_JUDGE = "visit_judge"
SNIPPET_MATCHER = "snippet_matcher"
CREDIT_AGGREGATOR = "credit_aggregator"
OUTCOME_JUDGE = "outcome_judge"
AUDITOR = "auditor"
ALL_QUEUES = (VISIT_JUDGE, SNIPPET_MATCHER, OUTCOME_JUDGE, CREDIT_AGGREGATOR, AUDITOR)

RUN_VISIT_CHAIN = "visit_judge.run_chain"
MATCH_SNIPPETS = "snippet_matcher.match_snippets"
JUDGE_OUTCOME = "outcome_judge.judge_outcome"
AGGREGATE_GROUP = "credit_aggregator.aggregate_group"
RUN_AUDIT = "auditor.run_audit"

TASK_QUEUES = {
    RUN_VISIT_CHAIN: VISIT_JUDGE,
    MATCH_SNIPPETS: SNIPPET_MATCHER,
    JUDGE_OUTCOME: OUTCOME_JUDGE,
    AGGREGATE_GROUP: CREDIT_AGGREGATOR,
    RUN_AUDIT: AUDITOR,
}
#: The task that runs each kind of work unit.
UNIT_TASKS = {"visit_chain": RUN_VISIT_CHAIN, "snippet": MATCH_SNIPPETS, "outcome": JUDGE_OUTCOME}
