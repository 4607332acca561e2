"""The long-poll loop of the results endpoints, against scripted reads of group states."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

from drcredit.scoring.results.events import GroupEvents
from drcredit_api.endpoints import _long_poll


def test_a_group_final_between_a_read_and_the_subscription_does_not_hold_the_answer() -> None:
    """A batch of groups 1 and 2: group 1 becomes final right after the first read (its
    report reaches no waiter yet); the read after subscribing finds 2 still running, and
    2's report must answer the long-poll at once, not after the recheck interval."""
    events = GroupEvents()
    events.local = True  # reports arrive: the recheck interval is long (10 s)
    rt: Any = SimpleNamespace(
        settings=SimpleNamespace(max_wait_s=60.0),
        pipeline=SimpleNamespace(events=events),
        db=SimpleNamespace(read_session=nullcontext),
    )
    reads: list[str] = []

    def read(_session: Any, may_wait: bool) -> tuple[list[int], str | None]:
        reads.append("read")
        if len(reads) == 1:
            events.finished([1])  # final just after this read saw it running
            return [1, 2], None
        if len(reads) == 2:
            threading.Timer(0.1, events.finished, args=([2],)).start()
            return [2], None
        return [], "advantages"

    async def main() -> tuple[str, float]:
        started = time.monotonic()
        answer = await _long_poll(rt, 60.0, read)
        return answer, time.monotonic() - started

    answer, took = asyncio.run(main())
    assert answer == "advantages"
    assert took < 2.0, took
    assert events.recheck_s >= 10.0  # the wait above was ended by the report, not a recheck
