"""A training step and an unreachable service: it waits, says so, and then either scores or raises.

The real app (embedded SQLite, offline judge) on a port that is closed at first; the step is
every adapter's :func:`score_step`. Nothing here may end with advantages the service did not give.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from drcredit.client import DrCreditClient
from drcredit.trainers import service
from drcredit.trainers.scoring import score_step
from drcredit.trainers.settings import DrCreditSettings
from drcredit_api.app import create_app
from tests.support.api import settings_for
from tests.support.live import free_port, serving
from tests.trainers.test_exclusion import rows


@contextmanager
def service_starting_after(delay_s: float, port: int, database: Path) -> Iterator[None]:
    """The app starts listening on ``port`` only ``delay_s`` seconds into the block."""
    stop = threading.Event()

    def run() -> None:
        time.sleep(delay_s)
        with serving(create_app(settings_for(f"sqlite:///{database}", None)), port=port):
            stop.wait(60)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


def test_a_step_waits_for_a_service_that_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(service, "RETRY_EVERY_S", 0.3)
    port = free_port()
    settings = DrCreditSettings(base_url=f"http://127.0.0.1:{port}", timeout_s=60, unreachable_timeout_s=30, run="r")
    with (
        service_starting_after(1.5, port, tmp_path / "late.sqlite3"),
        DrCreditClient(settings.base_url, max_attempts=1) as client,
        caplog.at_level(logging.WARNING, logger="drcredit.trainers"),
    ):
        scored = score_step(rows(), settings, client=client, step=7)
        document = client.advantages(scored.group_ids[0])
    assert [v.shape for v in scored.values] == [(8,), (8,)] and document["status"] == "done"
    waiting = [r.getMessage() for r in caplog.records if "cannot be reached" in r.getMessage()]
    assert waiting and "training step 7" in waiting[0] and "unreachable_timeout_s" in waiting[0]
    assert any("answers again" in r.getMessage() for r in caplog.records)


def test_a_step_raises_once_the_outage_outlasts_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "RETRY_EVERY_S", 0.2)
    settings = DrCreditSettings(base_url=f"http://127.0.0.1:{free_port()}", timeout_s=60, unreachable_timeout_s=1.0)
    started = time.monotonic()
    with (
        DrCreditClient(settings.base_url, max_attempts=1) as client,
        pytest.raises(
            service.DrCreditUnavailable, match=r"could not be reached for [0-9]+s while posting batch"
        ) as info,
    ):
        score_step(rows(), settings, client=client, step=3)
    assert 1.0 <= time.monotonic() - started < 20
    assert "training step 3" in str(info.value) and "DRCREDIT_UNREACHABLE_TIMEOUT_S" in str(info.value)


def test_the_steps_own_timeout_also_bounds_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "RETRY_EVERY_S", 0.2)
    settings = DrCreditSettings(base_url=f"http://127.0.0.1:{free_port()}", timeout_s=0.5, unreachable_timeout_s=600)
    started = time.monotonic()
    with DrCreditClient(settings.base_url, max_attempts=1) as client, pytest.raises(service.DrCreditUnavailable):
        score_step(rows(), settings, client=client)
    assert time.monotonic() - started < 20


def test_settings_read_the_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRCREDIT_UNREACHABLE_TIMEOUT_S", "42")
    monkeypatch.setenv("DRCREDIT_PROGRESS", "1")
    settings = DrCreditSettings.from_config({"drcredit": {"timeout_s": 90}})
    assert (settings.timeout_s, settings.unreachable_timeout_s, settings.progress) == (90.0, 42.0, True)
    assert DrCreditSettings.from_config({"drcredit": {"unreachable_timeout_s": 5}}).unreachable_timeout_s == 5.0
    monkeypatch.setenv("DRCREDIT_UNREACHABLE_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match=r"drcredit.unreachable_timeout_s .*'soon'"):
        DrCreditSettings.from_config()
    with pytest.raises(ValueError, match=r"drcredit.timeout_s must be a non-negative number of seconds, got -1"):
        DrCreditSettings(timeout_s=-1)
