"""The Celery application shared by the API (sender) and every worker (consumer).

Delivery is at-least-once by design: acknowledge late, requeue a task whose worker was
lost, prefetch nothing beyond a free slot (queued work stays visible in Redis for the
autoscaler), no result backend. Exactly-once *effect* comes from the database (leases
and unique judgments), not from the broker.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from drcredit.broker.queues import TASK_QUEUES
from drcredit.settings import Settings


def create_celery(settings: Settings) -> Celery:
    if not settings.broker_url:
        raise ValueError("DRCREDIT_BROKER_URL is not set: distributed execution needs a broker")
    app = Celery("drcredit", broker=settings.broker_url, set_as_current=True)
    conf: dict[str, Any] = {
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "task_ignore_result": True,
        "result_backend": None,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_routes": {name: {"queue": queue} for name, queue in TASK_QUEUES.items()},
        "worker_prefetch_multiplier": 1,
        "worker_disable_prefetch": os.environ.get("DRCREDIT_EXPERIMENT_PREFETCH") != "1",
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "broker_transport_options": {
            # An unacknowledged message (its worker died) is delivered again after this.
            "visibility_timeout": settings.broker_visibility_timeout_s,
            "socket_timeout": 10,
            "socket_connect_timeout": 10,
            "retry_on_timeout": True,
        },
        "broker_heartbeat": 0,
    }
    app.conf.update(conf)
    return app
