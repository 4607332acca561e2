"""Worker configuration of the snippet-matcher service (I/O bound: threads)."""

from drcredit.broker.queues import SNIPPET_MATCHER
from drcredit.wiring.worker import WorkerConfig

WORKER = WorkerConfig(queue=SNIPPET_MATCHER, concurrency=32, tasks_module="drcredit_snippet_matcher.tasks")
