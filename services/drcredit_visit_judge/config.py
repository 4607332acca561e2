"""Worker configuration of the visit-judge service.

Chains spend nearly all their time waiting on the judge. They run as coroutines on the
process's engine; a Celery thread only waits for its message's chains (one group's,
held for as long as its longest chain runs), so the thread count is high: it is the
number of messages this worker takes at once. Judge calls in flight are set apart
(``DRCREDIT_JUDGE_CONCURRENCY``), unless ``--concurrency`` sets both.
"""

from drcredit.broker.queues import VISIT_JUDGE
from drcredit.wiring.worker import WorkerConfig

WORKER = WorkerConfig(queue=VISIT_JUDGE, concurrency=512, tasks_module="drcredit_visit_judge.tasks")
