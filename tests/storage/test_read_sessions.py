"""Reads on SQLite do not queue behind a writer (the embedded long-poll's answer did)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sqlalchemy import func, select

from drcredit.storage import models as m
from drcredit.storage.database import Database
from drcredit.storage.migrate import upgrade


def test_a_read_session_reads_while_a_writer_holds_the_lock(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    upgrade(url)
    db = Database(url, 4)
    holding, release = threading.Event(), threading.Event()

    def writer() -> None:
        with db.session() as s:  # BEGIN IMMEDIATE: holds the write lock until commit
            s.execute(select(func.count()).select_from(m.Group))
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert holding.wait(10)
        started = time.monotonic()
        with db.read_session() as s:
            assert s.scalar(select(func.count()).select_from(m.Group)) == 0
        assert time.monotonic() - started < 0.5
        # A plain session queues behind the writer (BEGIN IMMEDIATE on the busy timeout).
        waited: list[float] = []
        reading = threading.Event()

        def plain_read() -> None:
            begun = time.monotonic()
            reading.set()
            with db.session() as s:
                s.scalar(select(func.count()).select_from(m.Group))
            waited.append(time.monotonic() - begun)

        reader = threading.Thread(target=plain_read)
        reader.start()
        assert reading.wait(10)
        time.sleep(0.6)
        release.set()
        reader.join(10)
        assert waited and waited[0] >= 0.5
    finally:
        release.set()
        thread.join(10)
        db.dispose()
