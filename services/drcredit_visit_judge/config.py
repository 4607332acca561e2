"""Worker configuration of the visit-judge service.

Chains spend nearly all their time waiting on the judge, so the pool is threads and the
concurrency is high: it is the number of judge calls this worker keeps in flight.
"""

from drcredit.broker.queues import VISIT_JUDGE
from drcredit.broker.worker import WorkerConfig

WORKER = WorkerConfig(queue=VISIT_JUDGE, concurrency=64, tasks_module="drcredit_visit_judge.tasks")
