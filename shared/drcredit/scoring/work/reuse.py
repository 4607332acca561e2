"""The tenant's store of valid judge answers, by request digest (docs/judges.md, "Reuse").

A request identical to one the judge answered validly before (same model, messages,
response format and sampling: :meth:`drcredit.judges.requests.Prompt.digest`) is
answered from here in any group of the same tenant, instead of the judge. This is the
group's "identical requests are asked once" (:class:`drcredit.scoring.work.judging.JudgeCalls`)
carried across groups and steps: the same key, one more place to find an answer.

Lookups of one pass of the event loop go to the database in one query, and saves go
in one transaction with every other save that arrived while the previous one was being
written (a group commit): a step makes thousands of calls, and a transaction each would
take the database threads from the judgments' own stores, while a lone answer is kept
at once, before its judgment's own (lingering) store ends its group. The store is an
optimisation, never a source of failure: a lookup that fails is a miss (with a
warning) and the judge is asked; a save that fails is dropped. It is bounded by an age
(older answers are neither used nor kept) and a number of entries (the oldest go
first), both enforced by a periodic prune.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from sqlalchemy import delete, func, select, tuple_

from drcredit.domain.verdicts import RejectedMatch, ScoreVerdict, SnippetMatch, SnippetVerdict, VisitVerdict
from drcredit.judges.base import JudgeResult
from drcredit.storage import models as m
from drcredit.storage.database import Database, insert_for, rows_changed, utcnow

log = logging.getLogger("drcredit.reuse")

ReuseMode = Literal["tenant", "group", "off"]
#: The store's two ways to fail, each warned of on its own.
StoreFailure = Literal["read", "save"]

#: Prune the store at most this often (per process).
PRUNE_EVERY_S = 60.0
#: A store that cannot be read is said so in the log at most this often.
WARN_EVERY_S = 60.0
#: Groups whose tenant a process remembers (a group's tenant never changes).
TENANTS_KEPT = 100_000


@dataclass(frozen=True)
class ReusePolicy:
    """``DRCREDIT_JUDGE_REUSE`` and its bounds."""

    mode: ReuseMode = "group"
    max_age_s: float = 30 * 86400.0
    max_entries: int = 2_000_000

    @property
    def across_groups(self) -> bool:
        return self.mode == "tenant"

    @property
    def twins(self) -> bool:
        """Whether identical requests within a group are asked once."""
        return self.mode != "off"


def verdict_document(verdict: Any) -> dict[str, Any]:
    """A validated verdict as JSON (the fields a judgment row keeps of it)."""
    if isinstance(verdict, VisitVerdict):
        return {
            "level": verdict.level,
            "page_ids": list(verdict.page_ids),
            "support_points": list(verdict.support_points),
            "rationale": verdict.rationale,
        }
    if isinstance(verdict, SnippetVerdict):
        return {
            "matches": [vars(x) for x in verdict.accepted],
            "rejected": [{"index": x.index, "match": x.raw, "reason": x.reason} for x in verdict.rejected],
        }
    assert isinstance(verdict, ScoreVerdict)
    return {"score": verdict.score, "rationale": verdict.rationale}


def verdict_of(kind: str, doc: dict[str, Any]) -> Any:
    if kind == "visit":
        return VisitVerdict(doc["level"], tuple(doc["page_ids"]), tuple(doc["support_points"]), doc["rationale"])
    if kind == "snippet":
        return SnippetVerdict(
            tuple(SnippetMatch(**x) for x in doc["matches"]),
            tuple(RejectedMatch(x["index"], x["match"], x["reason"]) for x in doc["rejected"]),
        )
    return ScoreVerdict(doc["score"], doc["rationale"])


class ReuseStore:
    """Lookups and saves of one process, on its engine's loop and database threads."""

    def __init__(
        self,
        db: Database,
        run_db: Callable[..., Awaitable[Any]],
        policy: ReusePolicy,
    ):
        self.db = db
        self._run_db = run_db
        self.policy = policy
        #: group row -> tenant (a group's tenant never changes).
        self._tenants: dict[int, str] = {}
        #: Lookups waiting for this pass's query: (tenant, digest) -> its future.
        self._asked: dict[tuple[str, str], asyncio.Future[dict[str, Any] | None]] = {}
        self._asking: asyncio.Task[None] | None = None
        self._saves: dict[tuple[str, str], dict[str, Any]] = {}
        self._saving: asyncio.Task[None] | None = None
        self._pruned_at = 0.0
        #: When each kind of failure ("read", "save") was last logged: one kind's
        #: warnings never hide the other's (a save of the previous step failing must
        #: not silence the news that the store cannot be read).
        self._warned_at: dict[StoreFailure, float] = {}

    # ------------------------------------------------------------------ lookups

    async def lookup(self, group_pk: int, digest: str, kind: str, layout: str | None) -> JudgeResult[Any] | None:
        """The stored answer of ``digest`` for the group's tenant, as a reused result; None
        when there is none (or the store cannot be read: the judge is asked)."""
        try:
            tenant = await self._tenant(group_pk)
            key = (tenant, digest)
            future = self._asked.get(key)
            if future is None:
                future = asyncio.get_running_loop().create_future()
                self._asked[key] = future
                if self._asking is None or self._asking.done():
                    self._asking = asyncio.ensure_future(self._ask_pending())
            row = await asyncio.shield(future)
        except Exception as exc:  # noqa: BLE001 - an optimisation: never a failed judgment (logged)
            self._warn("read", "the judge reuse store could not be read (asking the judge): %s", exc)
            return None
        if row is None or row["kind"] != kind:
            return None
        return JudgeResult(
            kind,  # type: ignore[arg-type]
            "ok",
            row["model"],
            row["backend"],
            verdict_of(kind, row["verdict"]),
            row["answer"],
            reused_from=(row["endpoint"], row["served_model"]),
            prompt_layout=layout,
            reused=True,
        )

    async def _tenant(self, group_pk: int) -> str:
        tenant = self._tenants.get(group_pk)
        if tenant is None:
            tenant = await self._run_db(self._read_tenant, group_pk)
            if len(self._tenants) >= TENANTS_KEPT:
                self._tenants.clear()
            self._tenants[group_pk] = tenant
        return tenant

    def _read_tenant(self, group_pk: int) -> str:
        with self.db.session() as s:
            tenant = s.scalar(select(m.Group.tenant).where(m.Group.id == group_pk))
        if tenant is None:
            raise LookupError(f"group {group_pk} is not stored")
        return tenant

    async def _ask_pending(self) -> None:
        await asyncio.sleep(0)  # the lookups of this pass of the loop go together
        while self._asked:  # and those that arrive while a query runs, in the next one
            asked, self._asked = self._asked, {}
            try:
                rows = await self._run_db(self._read, list(asked))
            except Exception as exc:  # noqa: BLE001 - handed to every waiter, which logs it
                for future in asked.values():
                    if not future.done():
                        future.set_exception(exc)
                        future.exception()  # retrieved: each waiter sees it
                continue
            for key, future in asked.items():
                if not future.done():
                    future.set_result(rows.get(key))

    def _read(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
        since = utcnow() - timedelta(seconds=self.policy.max_age_s)
        a = m.JudgeAnswer
        out: dict[tuple[str, str], dict[str, Any]] = {}
        with self.db.session() as s:
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                for row in s.execute(
                    select(
                        a.tenant, a.digest, a.kind, a.model, a.backend, a.served_model, a.endpoint, a.answer, a.verdict
                    ).where(tuple_(a.tenant, a.digest).in_(chunk), a.created_at >= since)
                ):
                    out[(row.tenant, row.digest)] = dict(row._mapping)
        return out

    # ------------------------------------------------------------------ saves

    async def save(self, group_pk: int, digest: str, result: JudgeResult[Any]) -> None:
        """Keep a valid answer of the judge's own (never a reused one) for later requests."""
        if result.status != "ok" or result.reused or result.verdict is None:
            return
        try:
            tenant = await self._tenant(group_pk)
        except Exception as exc:  # noqa: BLE001 - logged; the judgment is stored all the same
            self._warn("save", "a judge answer was not kept for reuse: %s", exc)
            return
        endpoint, served_model = result.answered_by
        self._saves[(tenant, digest)] = {
            "tenant": tenant,
            "digest": digest,
            "kind": result.kind,
            "model": result.model,
            "backend": result.backend,
            "served_model": served_model,
            "endpoint": endpoint,
            "answer": result.answer,
            "verdict": verdict_document(result.verdict),
            "created_at": utcnow(),
        }
        if self._saving is None or self._saving.done():
            self._saving = asyncio.ensure_future(self._write_pending())

    async def flush(self) -> None:
        """Wait for the saves under way (at shutdown)."""
        while self._saving is not None and not self._saving.done():
            await asyncio.shield(self._saving)

    async def _write_pending(self) -> None:
        await asyncio.sleep(0)  # the saves of this pass of the loop go together
        while self._saves:
            rows, self._saves = list(self._saves.values()), {}
            prune = time.monotonic() - self._pruned_at >= PRUNE_EVERY_S
            if prune:
                self._pruned_at = time.monotonic()
            try:
                await self._run_db(self._write, rows, prune)
            except Exception as exc:  # noqa: BLE001 - logged; the judgments are stored all the same
                self._warn("save", f"{len(rows)} judge answers were not kept for reuse: %s", exc)

    def _write(self, rows: list[dict[str, Any]], prune: bool) -> None:
        with self.db.session() as s:
            # An answer another process kept first stays (they are the same request's).
            s.execute(insert_for(s, m.JudgeAnswer).on_conflict_do_nothing(index_elements=["tenant", "digest"]), rows)
        if prune:
            self.prune()

    def _warn(self, kind: StoreFailure, message: str, exc: BaseException) -> None:
        """Log a kind of failure of the store once a minute at most (a broken store fails
        every call)."""
        now = time.monotonic()
        last = self._warned_at.get(kind)
        if last is None or now - last >= WARN_EVERY_S:
            self._warned_at[kind] = now
            log.warning(message, exc, exc_info=exc)

    def prune(self) -> int:
        """Drop answers past the age limit, then the oldest past the size limit; how many went."""
        a = m.JudgeAnswer
        with self.db.session() as s:
            since = utcnow() - timedelta(seconds=self.policy.max_age_s)
            dropped = rows_changed(s, delete(a).where(a.created_at < since))
            over = (s.scalar(select(func.count()).select_from(a)) or 0) - self.policy.max_entries
            if over > 0:
                oldest = select(a.id).order_by(a.created_at, a.id).limit(over).scalar_subquery()
                dropped += rows_changed(s, delete(a).where(a.id.in_(oldest)))
        return dropped
