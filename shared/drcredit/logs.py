"""Logging set-up: structlog for our records, stdlib logging routed through the same output.

Records carry the ids they concern (group, rollout, rubric) as fields; ``json`` format
is for deployments, ``console`` for people.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from drcredit.settings import Settings


def drop_color_message(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """uvicorn passes each start and stop line a second time with ANSI colour codes, as the
    record's ``color_message``; carried over as a field, it would put escape codes into
    JSON and console logs alike. The plain message is the event."""
    event.pop("color_message", None)
    return event


def configure_logging(settings: Settings, *, quiet: bool = False) -> None:
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if settings.log_format == "json"
        # Plain tracebacks: the rich default renders every frame's locals, which here
        # hold prompts with pages of text, at a CPU cost above a judge call's.
        else structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)
    )
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso"),
        structlog.stdlib.ExtraAdder(),
        drop_color_message,
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared, processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer]
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel("WARNING" if quiet else settings.log_level.upper())
    # The judge client logs every request at INFO: a line per judge call, measured at 8% of
    # a visit worker's CPU (httpx2 is the transport of the openai client).
    for noisy in ("httpx", "httpx2", "httpcore", "openai", "alembic"):
        logging.getLogger(noisy).setLevel("WARNING")
