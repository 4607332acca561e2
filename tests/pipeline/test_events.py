"""Completion reports that wake long-polls: in-process, and across processes on Postgres."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import text

from drcredit.scoring.dispatch import InProcessDispatcher
from drcredit.scoring.results.events import GroupEvents, NotificationListener, announce_final
from drcredit.storage.database import Database
from drcredit.wiring.runtime import Runtime
from tests.support.api import settings_for
from tests.support.builders import answer, group, page, rollout, search, visit
from tests.support.infra import postgres_database
from tests.support.judge_server import JudgeServer


def test_a_waiter_wakes_when_every_group_it_watches_is_reported_from_another_thread() -> None:
    events = GroupEvents()
    events.local = True  # long recheck: only the reports can end this wait early

    async def main() -> set[int]:
        with events.watching([1, 2]) as sub:
            threading.Timer(0.05, events.finished, args=([1],)).start()
            threading.Timer(0.10, events.finished, args=([3, 2],)).start()
            await events.wait(sub, timeout=30)
            return sub.pending

    assert asyncio.run(main()) == set()


def test_a_wait_ends_at_its_timeout_when_nothing_is_reported() -> None:
    events = GroupEvents()
    events.local = True

    async def main() -> set[int]:
        with events.watching([7]) as sub:
            await events.wait(sub, timeout=0.05)
            return sub.pending

    assert asyncio.run(main()) == {7}


def test_without_a_source_of_reports_waiters_recheck_quickly() -> None:
    events = GroupEvents()
    assert events.recheck_s < 0.5  # polling, as before there were reports
    events.listening = True
    assert events.recheck_s >= 1.0
    events.listening = False
    events.local = True
    assert events.recheck_s >= 1.0


def test_everyone_look_again_wakes_every_waiter_without_a_report() -> None:
    events = GroupEvents()
    events.local = True

    async def main() -> list[set[int]]:
        with events.watching([1, 2]) as first, events.watching([3]) as second:
            threading.Timer(0.05, events.everyone_look_again).start()
            started = time.monotonic()
            await events.wait(first, timeout=30)
            await events.wait(second, timeout=30)
            assert time.monotonic() - started < 5
            return [first.pending, second.pending]

    assert asyncio.run(main()) == [set(), set()]


def test_a_finished_waiter_leaves_no_subscription_behind() -> None:
    events = GroupEvents()

    async def main() -> None:
        with events.watching([1, 2]):
            pass

    asyncio.run(main())
    assert events._subscriptions == {}
    events.finished([1, 2])  # nobody is waiting: nothing to wake


@pytest.mark.infra
def test_a_committed_announcement_reaches_a_listener_and_a_rolled_back_one_does_not() -> None:
    with postgres_database() as url:
        db = Database(url)
        events = GroupEvents()
        conninfo = db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        listener = NotificationListener(conninfo, events)
        listener.start()
        try:
            deadline = time.monotonic() + 30
            while not events.listening and time.monotonic() < deadline:
                time.sleep(0.02)
            assert events.listening

            async def main() -> tuple[set[int], set[int]]:
                with events.watching([41, 42]) as sub:
                    with pytest.raises(RuntimeError), db.session() as s:
                        announce_final(s, 41)
                        raise RuntimeError("roll back")
                    with db.session() as s:
                        announce_final(s, 42)
                    await events.wait(sub, timeout=1.0)
                    after_first = set(sub.pending)
                with events.watching([41]) as sub:
                    with db.session() as s:
                        announce_final(s, 41)
                    await events.wait(sub, timeout=30)
                    return after_first, set(sub.pending)

            pending_after_rollback, pending_after_commit = asyncio.run(main())
            # Only 42 was announced by a committed transaction; the wait ended at its
            # timeout with 41 still pending. Then 41's committed announcement came.
            assert pending_after_rollback == {41}
            assert pending_after_commit == set()
        finally:
            listener.stop()
            listener.join(10)
            db.dispose()


@pytest.mark.infra
def test_waiters_look_again_when_the_listener_loses_and_regains_its_connection() -> None:
    """No announcement reaches this process while its listener is away: the waiters are
    woken when it goes (to poll) and when it is back (to catch what they missed)."""
    with postgres_database() as url:
        db = Database(url)
        events = GroupEvents()
        conninfo = db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        listener = NotificationListener(conninfo, events)
        try:

            async def woken_by(action: Callable[[], object]) -> float:
                with events.watching([99]) as sub:
                    started = time.monotonic()
                    action()
                    await events.wait(sub, timeout=30)
                    assert sub.pending == set()  # woken, not timed out
                    return time.monotonic() - started

            def drop_the_listeners_connection() -> None:
                with db.session() as s:
                    s.execute(
                        text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                            " WHERE query LIKE 'LISTEN drcredit_group_final%' AND pid <> pg_backend_pid()"
                        )
                    )

            assert asyncio.run(woken_by(listener.start)) < 10  # connected: look again
            assert events.listening
            assert asyncio.run(woken_by(drop_the_listeners_connection)) < 10  # lost: poll
            deadline = time.monotonic() + 30
            while not events.listening and time.monotonic() < deadline:
                time.sleep(0.05)
            assert events.listening  # back after its backoff
        finally:
            listener.stop()
            listener.join(10)
            db.dispose()


def test_the_pipeline_reports_each_group_it_finishes_done_or_failed(tmp_path: Path, marker_judge: JudgeServer) -> None:
    rt = Runtime.build(settings_for(f"sqlite:///{tmp_path / 'db.sqlite3'}", marker_judge.url))
    reported: list[int] = []
    report = rt.pipeline.events.finished
    rt.pipeline.events.finished = lambda pks: (reported.extend(pks), report(pks))  # type: ignore[method-assign]
    try:
        assert rt.pipeline.events.local  # embedded: every group finishes in this process
        two = group(
            rollout("a", visit(page("W1", "https://x.org/1", "[R1:2:fact-1]")), answer(), reward=1.0),
            rollout("b", search(), answer(), reward=0.0),
        )
        done = rt.pipeline.submit_group("t", two)
        assert isinstance(rt.dispatcher, InProcessDispatcher)
        assert rt.dispatcher.wait_idle(30)
        opened = rt.pipeline.submit_group("t", two.model_copy(update={"group_id": "open", "expected_rollouts": 3}))
        rt.pipeline.fail_group(opened.group_pk, "the trainer gave up")
        rt.pipeline.fail_group(opened.group_pk, "failed twice")  # already final: not reported again
    finally:
        rt.close()
    assert reported == [done.group_pk, opened.group_pk]


def test_a_waiter_waits_only_for_the_groups_a_read_after_subscribing_found_running() -> None:
    """Group 1 became final before the subscription (its report went to nobody); the read
    after subscribing finds only 2 running, so 2's report alone ends the wait."""
    events = GroupEvents()
    events.local = True

    async def main() -> float:
        events.finished([1])
        with events.watching([1, 2]) as sub:
            sub.still_pending([2])
            threading.Timer(0.05, events.finished, args=([2],)).start()
            started = time.monotonic()
            await events.wait(sub, timeout=30)
            return time.monotonic() - started

    assert asyncio.run(main()) < 5
