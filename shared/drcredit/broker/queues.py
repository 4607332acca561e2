"""Queue and task names: one queue per service, so each scales on its own backlog."""

from __future__ import annotations

VISIT_JUDGE = "visit_judge"
SNIPPET_MATCHER = "snippet_matcher"
CREDIT_AGGREGATOR = "credit_aggregator"
ALL_QUEUES = (VISIT_JUDGE, SNIPPET_MATCHER, CREDIT_AGGREGATOR)

RUN_VISIT_CHAIN = "visit_judge.run_chain"
MATCH_SNIPPETS = "snippet_matcher.match_snippets"
AGGREGATE_GROUP = "credit_aggregator.aggregate_group"

TASK_QUEUES = {RUN_VISIT_CHAIN: VISIT_JUDGE, MATCH_SNIPPETS: SNIPPET_MATCHER, AGGREGATE_GROUP: CREDIT_AGGREGATOR}
