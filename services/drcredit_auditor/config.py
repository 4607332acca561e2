"""Worker configuration of the auditor.

An audit runs as one task: its thread waits while the sampled groups' judge calls run
as coroutines on the process's engine, below every training call. A few threads run a
few audits at once. Deployments start it without ``--concurrency``, which would also cap
an audit's judge calls at the thread count.
"""

from drcredit.broker.queues import AUDITOR
from drcredit.wiring.worker import WorkerConfig

WORKER = WorkerConfig(queue=AUDITOR, concurrency=4, tasks_module="drcredit_auditor.tasks", pin_concurrency=False)
