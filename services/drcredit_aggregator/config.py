"""Worker configuration of the credit aggregator.

Aggregation is short and CPU-bound (the pure credit math), one task per group; a few
threads keep the database round trips overlapped.
"""

from drcredit.broker.queues import CREDIT_AGGREGATOR
from drcredit.wiring.worker import WorkerConfig

WORKER = WorkerConfig(queue=CREDIT_AGGREGATOR, concurrency=4, tasks_module="drcredit_aggregator.tasks")
