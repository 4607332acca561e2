"""What a unit kind may use while it runs: the one interface between kinds and the rest.

A kind reads its rollout through :attr:`UnitContext.rollouts`, asks the judge through
:attr:`UnitContext.judging` under a slot of :attr:`UnitContext.engine`, stores every
answer through :attr:`UnitContext.writer` (never in a transaction of its own, so the
order of stores and the lease check stay the writer's), and fails its group through
:attr:`UnitContext.fail_group` when the failure policy says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from drcredit.judges.base import Judge
from drcredit.scoring.engine import Engine
from drcredit.scoring.work.judging import JudgeCalls
from drcredit.scoring.work.rollout_cache import RolloutCache
from drcredit.scoring.work.snippet_release import SnippetRelease
from drcredit.scoring.work.writes import JudgmentWriter
from drcredit.storage.database import Database


@dataclass(frozen=True)
class UnitContext:
    judge: Judge
    engine: Engine
    db: Database
    rollouts: RolloutCache
    judging: JudgeCalls
    writer: JudgmentWriter
    snippets: SnippetRelease
    #: Set when the process stops: a unit returns after its current call (resumable).
    stopping: threading.Event
    #: Fail a group with a reason (blocking: call it through ``engine.db``).
    fail_group: Callable[[int, str], None]
