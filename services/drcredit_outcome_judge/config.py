"""Worker configuration of the outcome-judge service.

An outcome unit judges one rollout's report: one call per rubric with a non-zero weight
and the citation calls of its claims, all at once. Like the visit judge, the units run
as coroutines and the concurrency is the judge calls this worker keeps in flight.
"""

from drcredit.broker.queues import OUTCOME_JUDGE
from drcredit.wiring.worker import WorkerConfig

WORKER = WorkerConfig(queue=OUTCOME_JUDGE, concurrency=64, tasks_module="drcredit_outcome_judge.tasks")
