"""Worker configuration of the visit-judge service.

Chains spend nearly all their time waiting on the judge. They run as coroutines on the
process's engine; a Celery thread only waits for its message's chains, so the
concurrency is high: it is the number of judge calls this worker keeps in flight (and
of messages it takes at once).
"""

from drcredit.broker.queues import VISIT_JUDGE
from drcredit.broker.worker import WorkerConfig

WORKER = WorkerConfig(queue=VISIT_JUDGE, concurrency=256, tasks_module="drcredit_visit_judge.tasks")
