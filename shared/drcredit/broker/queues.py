"""Queue and task names, and the deployment's services: one queue per worker service, so
each scales on its own backlog.

:data:`SERVICES` is the one list of the processes a deployment runs. The CLI's
``drcredit worker --queues``, the deployment files' tests and the tests of
``docs/operations.md`` and the README all read it, so no document can name a service the
code does not have or miss one it has.
"""

from __future__ import annotations

from dataclasses import dataclass

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
#: The queue each kind of work unit waits on (a group's aggregation waits on CREDIT_AGGREGATOR).
UNIT_QUEUES = {kind: TASK_QUEUES[task] for kind, task in UNIT_TASKS.items()}


@dataclass(frozen=True)
class Service:
    """One kind of process of a deployment."""

    #: As the documents name it ("visit judge").
    name: str
    #: Its package under ``services/``.
    package: str
    #: The queue its workers consume; None for the ingest API, which only sends.
    queue: str | None = None

    @property
    def command(self) -> str:
        """How to start one by hand."""
        if self.queue is None:
            return "drcredit serve --host 0.0.0.0 --port 8000"
        return f"drcredit worker --queues {self.queue}"

    @property
    def compose_name(self) -> str:
        """Its service in docker-compose.yml and its Deployment's suffix in k8s/."""
        return "api" if self.queue is None else self.queue.replace("_", "-")


SERVICES = (
    Service("ingest API", "drcredit_api"),
    Service("visit judge", "drcredit_visit_judge", VISIT_JUDGE),
    Service("snippet matcher", "drcredit_snippet_matcher", SNIPPET_MATCHER),
    Service("outcome judge", "drcredit_outcome_judge", OUTCOME_JUDGE),
    Service("credit aggregator", "drcredit_aggregator", CREDIT_AGGREGATOR),
    Service("auditor", "drcredit_auditor", AUDITOR),
)
#: The services that run ``drcredit worker``, one per queue, in :data:`ALL_QUEUES` order.
WORKER_SERVICES = tuple(s for s in SERVICES if s.queue is not None)
assert tuple(s.queue for s in WORKER_SERVICES) == ALL_QUEUES, "every queue has exactly one worker service"
