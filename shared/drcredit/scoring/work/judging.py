"""Judge calls as units make them: one call under the outage watch, and each distinct
request made once per group, and (reuse ``tenant``) once per tenant.

Identical requests in a group (twin turns of rollouts that visited the same pages with
the same history, the same claim cited on the same pages) are answered once: an answer
already stored is reused (a cache hit), one in flight in this process is awaited in
memory, and with ``claims`` on (distributed mode) one in flight in another process is
awaited through a ``request_claims`` row, which expires with the lease if its owner dies.
Across groups the same request key finds a valid answer the tenant got before in the
reuse store (:mod:`drcredit.scoring.work.reuse`), before any call is made.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from drcredit import metrics
from drcredit.domain.usage import JudgePrice, Usage
from drcredit.domain.verdicts import RejectedMatch, ScoreVerdict, SnippetMatch, SnippetVerdict, VisitVerdict
from drcredit.judges.base import Judge, JudgeResult, Prompt
from drcredit.scoring.engine import Engine
from drcredit.scoring.results.outcomes import OUTCOME_KINDS
from drcredit.scoring.work.outages import JudgeOutages
from drcredit.scoring.work.reuse import ReusePolicy, ReuseStore
from drcredit.scoring.work.units import Stopping
from drcredit.storage import models as m
from drcredit.storage.database import Database, rows_changed, utcnow
from drcredit.tenancy.owner import CALL_OWNER

log = logging.getLogger("drcredit.judging")

R = TypeVar("R", VisitVerdict, SnippetVerdict, ScoreVerdict)
S = TypeVar("S")


class JudgeCalls:
    """How a unit asks the judge: :meth:`call` for a request of its own, :meth:`once`
    for one that may have a twin in its group."""

    def __init__(
        self,
        db: Database,
        engine: Engine,
        outages: JudgeOutages,
        stopping: threading.Event,
        *,
        claims: bool,
        worker_id: str,
        lease_s: float,
        price: JudgePrice | None = None,
        reuse: ReusePolicy | None = None,
    ):
        self.db = db
        self.policy = reuse or ReusePolicy()
        #: The tenant's store of earlier answers (reuse ``tenant`` only).
        self.store = ReuseStore(db, engine.db, self.policy) if self.policy.across_groups else None
        #: What the judge's tokens cost, for the cost metric (None: no price set).
        self.price = price
        self.engine = engine
        self.outages = outages
        self.stopping = stopping
        #: Claim requests in the database so that identical requests in flight in
        #: different processes are made once (distributed mode).
        self.claims = claims
        self.worker_id = worker_id
        self.lease_s = lease_s
        #: Requests in flight on the engine loop (only touched from that loop).
        self._inflight: dict[tuple[int, str], asyncio.Future[JudgeResult[Any]]] = {}

    def keys(self, judge: Judge, prompt: Prompt, twin: bool) -> tuple[str | None, str | None]:
        """(the key of a request that may have a twin in its group, the key it is looked up
        and kept under in the reuse store), each None when not needed: hashing a prompt
        with pages costs about as much CPU as the call."""
        if not self.policy.twins or not (twin or self.store is not None):
            return None, None
        key = judge.request_key(prompt)
        return (key if twin else None), (key if self.store is not None else None)

    async def call(
        self,
        group_pk: int,
        call: Callable[[], Awaitable[JudgeResult[R]]],
        reuse: tuple[str, Prompt] | None = None,
    ) -> JudgeResult[R]:
        """One judgment (with its retries, and its waits for an unreachable judge); the
        caller holds a judge slot. With ``reuse`` (the request's key and prompt) an answer
        the tenant got before is returned instead (``reused``), and a valid new one kept.

        A slot covers the call *and* the store of its answer, so the judge answers a
        process could lose when it dies are at most its judge concurrency.
        """
        if reuse is not None and self.store is not None:
            key, prompt = reuse
            hit = await self.store.lookup(group_pk, key, prompt.kind, prompt.layout)
            if hit is not None:
                metrics.JUDGE_REUSED.labels(prompt.kind).inc()
                self.engine.start_order.call_ended()  # no call: nothing to learn, nobody to hold
                return hit
        with self.outages.judging(group_pk):
            result = await call()
        if reuse is not None and self.store is not None:
            await self.store.save(group_pk, reuse[0], result)
        observe(result, self.price)
        if result.status == "ok" and result.attempts:
            # The judge's own answer time: under a limited judge a call also waits here
            # for its turn, and a latency with that wait in it held the step's last
            # snippet calls back for ten seconds (BENCHMARKS.md, eighteenth round).
            answered = result.attempts[-1]
            self.engine.start_order.observe_latency(answered.latency_s - answered.waited_s)
        else:
            self.engine.start_order.call_ended()  # a failed call teaches no latency
        return result

    async def once(
        self,
        group_pk: int,
        key: str,
        kind: str,
        call: Callable[[], Awaitable[JudgeResult[R]]],
        store: Callable[[JudgeResult[R], bool], Awaitable[S]],
        reuse: tuple[str, Prompt] | None = None,
    ) -> tuple[JudgeResult[R], S]:
        """Judge a request once per group and store the result with ``store``; returns
        (result, what the store came to). ``reuse``: as for :meth:`call`."""
        hit = await self.engine.db(self.stored_answer, group_pk, key, kind)
        if hit is not None:
            # Answered without a call: units held for this process's first call must
            # not wait on a chain that may make none.
            self.engine.start_order.call_ended()
            return hit, await store(hit, True)
        slot = (group_pk, key)
        pending = self._inflight.get(slot)
        if pending is not None:
            result = await asyncio.shield(pending)
            metrics.JUDGE_CACHE_HITS.labels(kind).inc()
            return result, await store(result, True)
        future: asyncio.Future[JudgeResult[Any]] = asyncio.get_running_loop().create_future()
        self._inflight[slot] = future
        token = None
        try:
            if self.claims:
                token, hit = await self._await_claim(group_pk, key, kind)
                if hit is not None:
                    future.set_result(hit)
                    return hit, await store(hit, True)
            result = await self.call(group_pk, call, reuse)
            stored = await store(result, False)
            future.set_result(result)
            return result, stored
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: waiters see it, nobody else must
            raise
        finally:
            self._inflight.pop(slot, None)
            if token is not None:
                await self.engine.db(self.drop_claim, group_pk, key, token)

    def stored_answer(self, group_pk: int, key: str, kind: str) -> JudgeResult[Any] | None:
        with self.db.session() as s:
            row = s.scalars(
                select(m.Judgment)
                .where(
                    m.Judgment.group_pk == group_pk,
                    m.Judgment.request_key == key,
                    m.Judgment.status == "ok",
                    m.Judgment.cache_hit.is_(False),
                )
                .limit(1)
            ).first()
            if row is None:
                return None
            metrics.JUDGE_CACHE_HITS.labels(kind).inc()
            return result_from_row(row)

    async def _await_claim(self, group_pk: int, key: str, kind: str) -> tuple[str | None, JudgeResult[Any] | None]:
        """Claim the request for this process, or wait for its owner's stored answer."""
        token = f"{self.worker_id}:{uuid.uuid4().hex[:8]}"
        pause = 0.05
        while True:
            outcome = await self.engine.db(self.try_claim, group_pk, key, kind, token)
            if outcome is not None:
                return outcome
            if self.stopping.is_set():
                raise Stopping()
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, 0.5)

    def try_claim(
        self, group_pk: int, key: str, kind: str, token: str
    ) -> tuple[str | None, JudgeResult[Any] | None] | None:
        """(token, None): the request is this delivery's to make; (None, answer): its
        owner stored the answer; None: its owner is still at it."""
        try:
            with self.db.session() as s:
                s.add(m.RequestClaim(group_pk=group_pk, request_key=key, owner=token, claimed_at=utcnow()))
        except IntegrityError:
            pass
        else:
            # The owner this delivery waited on stores its answer before letting go of
            # its claim: a claim won just after it must take that answer, not ask again.
            hit = self.stored_answer(group_pk, key, kind)
            if hit is None:
                return token, None
            self.drop_claim(group_pk, key, token)
            return None, hit
        hit = self.stored_answer(group_pk, key, kind)
        if hit is not None:
            return None, hit
        with self.db.session() as s:
            stale = utcnow() - timedelta(seconds=self.lease_s)
            stolen = rows_changed(
                s,
                update(m.RequestClaim)
                .where(
                    m.RequestClaim.group_pk == group_pk,
                    m.RequestClaim.request_key == key,
                    m.RequestClaim.claimed_at < stale,
                )
                .values(owner=token, claimed_at=utcnow()),
            )
        return (token, None) if stolen else None

    def drop_claim(self, group_pk: int, key: str, token: str) -> None:
        try:
            with self.db.session() as s:
                s.execute(
                    delete(m.RequestClaim).where(
                        m.RequestClaim.group_pk == group_pk,
                        m.RequestClaim.request_key == key,
                        m.RequestClaim.owner == token,
                    )
                )
        except Exception:
            log.warning("could not drop the claim on a judge request", exc_info=True)


def result_from_row(row: m.Judgment) -> JudgeResult[Any]:
    """A stored answer as the judge's result (for a request asked again in the group)."""
    verdict: Any
    if row.kind == "visit":
        verdict = VisitVerdict(
            row.level or 0, tuple(row.page_ids or ()), tuple(row.support_points or ()), row.rationale or ""
        )
    elif row.kind in OUTCOME_KINDS:
        verdict = ScoreVerdict(row.level or 0, row.rationale or "")
    else:
        verdict = SnippetVerdict(
            tuple(SnippetMatch(**x) for x in row.matches or ()),
            tuple(RejectedMatch(x["index"], x["match"], x["reason"]) for x in row.rejected_matches or ()),
        )
    return JudgeResult(
        row.kind,  # type: ignore[arg-type]
        "ok",
        row.model or "",
        row.backend or "",
        verdict,
        row.answer,
        reused_from=(row.endpoint, row.served_model),
        prompt_layout=row.prompt_layout,
    )


def observe(result: JudgeResult[Any], price: JudgePrice | None = None) -> None:
    usage = Usage(
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        cached_prompt_tokens=result.cached_tokens,
    )
    cost = usage.cost_usd(price)
    tenant = CALL_OWNER.get().tenant
    if result.attempts:  # a call of its own (not a reused answer): the tenant's use of the judge
        metrics.observe_tenant(tenant, usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens, cost)
    metrics.observe_judgment(
        result.backend,
        result.kind,
        result.status,
        result.latency_s,
        usage.prompt_tokens,
        usage.completion_tokens,
        (a.outcome for a in result.attempts),
        usage.cached_prompt_tokens,
        cost,
    )
