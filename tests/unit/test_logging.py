"""Logging set-up: the judge client's per-request lines stay out of an INFO log."""

from __future__ import annotations

import logging

from drcredit.logs import configure_logging
from drcredit.settings import Settings


def test_judge_client_request_lines_are_not_logged_at_info() -> None:
    configure_logging(Settings(log_level="INFO"))
    assert logging.getLogger("drcredit").isEnabledFor(logging.INFO)
    for name in ("httpx2", "httpx", "openai"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert logging.getLogger(name).isEnabledFor(logging.WARNING), name
