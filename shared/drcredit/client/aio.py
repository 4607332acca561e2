"""The asyncio client, for trainers that generate rollouts concurrently."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

import httpx
from tenacity import AsyncRetrying

from drcredit.client import _common as c
from drcredit.client import _requests as rq
from drcredit.client._requests import Call, Document, JSONDict
from drcredit.client.errors import NotReady

__all__ = ["AsyncDrCreditClient"]


class AsyncDrCreditClient:
    """Asyncio client of the DrCredit REST API (docs/api.md); the same methods as
    :class:`DrCreditClient`, awaited.

    Give every group and batch an id you can recompute (``f"{run}-step{step}-q{i}"``):
    re-posting an id with the same content is idempotent on the server, which is what makes
    retrying a POST safe. When no id is given the client makes one (:func:`new_group_id`)
    before the first attempt, so its retries reuse it.

    Retries: GETs, and POSTs carrying an id, are retried on connection errors and 5xx with
    exponential backoff and jitter; 4xx answers are never retried. ``max_attempts`` counts
    the first try. ``base_url`` defaults to ``$DRCREDIT_URL`` (else http://127.0.0.1:8000),
    ``api_key`` to ``$DRCREDIT_API_KEY``.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | httpx.Timeout | None = c.DEFAULT_TIMEOUT_S,
        max_attempts: int = 4,
        backoff_initial: float = 0.5,
        backoff_max: float = 8.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        retry = c.RetryPolicy(max_attempts, backoff_initial, backoff_max)
        self._config = c.ClientConfig.create(base_url, api_key, timeout, retry, headers)
        self._http = httpx.AsyncClient(
            base_url=self._config.base_url, headers=self._config.headers, timeout=self._config.timeout
        )

    @property
    def base_url(self) -> str:
        return self._config.base_url

    async def close(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    aclose = close

    async def __aenter__(self) -> AsyncDrCreditClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------------ transport

    async def _send(self, call: Call) -> httpx.Response:
        response = await self._http.request(
            call.method, call.path, params=call.params, json=call.json, timeout=self._config.timeout_for(call)
        )
        return c.check_transient(response, call)

    async def _request(self, call: Call) -> Any:
        attempts = 0
        try:
            async for attempt in AsyncRetrying(**self._config.retrying(call)):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    response = await self._send(call)
        except (c.Transient, httpx.TransportError) as exc:
            raise c.give_up(exc, call, self.base_url, attempts) from exc
        return c.finish(response, call, attempts)

    async def _json(self, call: Call) -> JSONDict:
        return c.json_object(await self._request(call))

    # ------------------------------------------------------------------------ ingest

    async def submit_group(
        self,
        group: Document,
        *,
        group_id: str | None = None,
        params: Document | None = None,
        metadata: Any = None,
        run: str | None = None,
        step: int | None = None,
    ) -> JSONDict:
        """Post one rollout group; returns the 202 body (``group_id``, ``status``, ``created``).

        ``run`` and ``step`` file the group under a training run and step (``metadata.run``,
        ``metadata.step``) for the viewer and the run analytics.
        """
        return await self._json(rq.submit_group(group, group_id, params, metadata, run, step))

    async def open_group(
        self,
        question: str,
        rubrics: Iterable[Document],
        expected_rollouts: int,
        *,
        group_id: str | None = None,
        rollouts: Iterable[Document] = (),
        params: Document | None = None,
        metadata: Any = None,
        run: str | None = None,
        step: int | None = None,
    ) -> JSONDict:
        """Open a streaming group so judging starts while the other rollouts are generated."""
        return await self._json(
            rq.open_group(question, rubrics, expected_rollouts, group_id, rollouts, params, metadata, run, step)
        )

    async def add_rollout(self, group_id: str, rollout: Document) -> JSONDict:
        """Add one rollout to an open group (idempotent on the rollout id)."""
        return await self._json(rq.add_rollout(group_id, rollout))

    async def submit_batch(
        self,
        groups: Iterable[Document],
        *,
        batch_id: str | None = None,
        run: str | None = None,
        step: int | None = None,
    ) -> JSONDict:
        """Post a training step's groups in one call, stored atomically."""
        return await self._json(rq.submit_batch(groups, batch_id, run, step))

    # ------------------------------------------------------------------------ results

    async def group_status(self, group_id: str) -> JSONDict:
        """Status and judging progress of a group."""
        return await self._json(rq.group_status(group_id))

    async def batch_status(self, batch_id: str) -> JSONDict:
        """Status of every group of a batch."""
        return await self._json(rq.batch_status(batch_id))

    async def advantages(self, group_id: str, *, wait: float | None = None) -> JSONDict:
        """Per-turn advantages; raises :class:`NotReady` if not done within ``wait`` seconds."""
        return await self._json(rq.advantages(group_id, wait))

    async def batch_advantages(self, batch_id: str, *, wait: float | None = None) -> JSONDict:
        """Advantages of every group of a batch; :class:`NotReady` until all have finished."""
        return await self._json(rq.batch_advantages(batch_id, wait))

    async def credits(self, group_id: str, *, wait: float | None = None) -> JSONDict:
        """The breakdown behind the advantages (credits, judgments, support histories)."""
        return await self._json(rq.credits(group_id, wait))

    async def replay(self, group_id: str, params: Document | None = None) -> JSONDict:
        """Advantages recomputed from stored judgments under other params (no judge call)."""
        return await self._json(rq.replay(group_id, params))

    # ------------------------------------------------------------------------ judge audits

    async def start_audit(
        self,
        judge: str,
        *,
        run: str | None = None,
        batch_id: str | None = None,
        group_ids: Iterable[str] | None = None,
        sample_groups: int | None = None,
        seed: int = 0,
        labelers: Iterable[str] | None = None,
    ) -> JSONDict:
        """Start a judge audit (docs/audit.md): the operator's audit judge ``judge`` re-scores
        ``sample_groups`` done groups (all when None) of one scope, a ``run``, a ``batch_id``
        or a list of ``group_ids``, drawn with ``seed``. Returns the queued audit's summary
        (``audit_id``, ``group_ids``, ...). Never retried: each call starts another audit.

        ``judge="human"`` compares the original judgments with people's labels (those of
        ``labelers``, every labeler's when None) instead: no judge call, done at once."""
        return await self._json(rq.start_audit(judge, run, batch_id, group_ids, sample_groups, seed, labelers))

    async def get_audit(self, audit_id: str, *, wait: float | None = None) -> JSONDict:
        """The audit's report once done; :class:`NotReady` (``status`` queued, running or
        failed, a failure's reason in its message) until then, after ``wait`` seconds."""
        return await self._json(rq.audit(audit_id, wait))

    async def list_audits(self, *, run: str | None = None) -> list[JSONDict]:
        """This tenant's audits, newest first (``run``: those over that run's groups); a done
        one carries its ``agreement``, ``effect`` (without per-group figures) and ``usage``."""
        listed = await self._json(rq.audits(run))
        return list(listed.get("audits") or [])

    # ------------------------------------------------------------------------ labels from people

    async def label_queue(
        self,
        labeler: str,
        *,
        run: str | None = None,
        batch_id: str | None = None,
        group_ids: Iterable[str] | None = None,
        kind: str | Iterable[str] | None = None,
        n: int = 20,
        seed: int = 0,
    ) -> JSONDict:
        """``n`` judgments of one scope for ``labeler`` to label (docs/audit.md): each item
        has ``item_id``, ``group_id``, ``kind``, ``key`` and ``shown`` (what the judge saw),
        never the judge's answer; none ``labeler`` already labeled. ``kind``: one of visit,
        snippet, report_rubric, citation, several, or all when None."""
        return await self._json(rq.label_queue(labeler, run, batch_id, group_ids, kind, n, seed))

    async def post_label(
        self,
        value: int,
        labeler: str,
        *,
        item_id: str | None = None,
        group_id: str | None = None,
        kind: str | None = None,
        key: Mapping[str, Any] | None = None,
    ) -> JSONDict:
        """Store ``labeler``'s ``value`` for a judgment named by ``item_id`` (from the queue)
        or by ``group_id``, ``kind`` and ``key``; replaces that labeler's earlier label on
        the key. The answer carries the judge's own answer (``judge``)."""
        return await self._json(rq.post_label(value, labeler, item_id, group_id, kind, key))

    async def import_labels(self, labels: Iterable[Mapping[str, Any]]) -> JSONDict:
        """Store many labels at once (``{"stored": N, "replaced": M}``), or none of them:
        :class:`InvalidRequest` names each refused one as ``labels[i].field``."""
        return await self._json(rq.import_labels(labels))

    async def list_labels(
        self, *, group_ids: Iterable[str] | None = None, labeler: str | None = None
    ) -> list[JSONDict]:
        """This tenant's labels (of these groups, by this labeler), by group and key."""
        listed = await self._json(rq.labels(group_ids, labeler))
        return list(listed.get("labels") or [])

    async def delete_label(self, item_id: str, labeler: str) -> None:
        """Take back ``labeler``'s label on ``item_id`` (:class:`NotFound` when there is none)."""
        await self._request(rq.delete_label(item_id, labeler))

    # ------------------------------------------------------------------------ operations

    async def healthz(self) -> JSONDict:
        """The process is up."""
        return await self._json(rq.healthz())

    async def readyz(self) -> JSONDict:
        """Database and broker reachable; a not-ready answer (503) is returned, not raised."""
        return await self._json(rq.readyz())

    async def metrics(self) -> str:
        """Prometheus text format."""
        return str(await self._request(rq.metrics()))

    # ------------------------------------------------------------------------ waiting

    async def wait_for_advantages(
        self, group_id: str, *, timeout: float | None, poll_wait: float = 30.0, progress: bool = False
    ) -> JSONDict:
        """Long-poll until the group is done and return its advantages.

        Raises :class:`DrCreditTimeout` (a ``TimeoutError``) with the last status after
        ``timeout`` seconds (None waits forever) and :class:`GroupFailed` if the group failed.
        ``progress`` shows a judgments progress bar on stderr.
        """
        w = c.Waiter("group", group_id, timeout, poll_wait, progress)
        with w.bar:
            while True:
                try:
                    return w.finished(await self.advantages(group_id, wait=w.next_wait()))
                except NotReady as exc:
                    w.not_ready(exc)
                if w.wants_status():
                    w.saw_status(await self.group_status(group_id))
                w.check_deadline()
                await asyncio.sleep(w.pause())

    async def wait_for_batch(
        self, batch_id: str, *, timeout: float | None, poll_wait: float = 30.0, progress: bool = False
    ) -> JSONDict:
        """Long-poll until every group of the batch has finished; return the batch's advantages.

        Raises :class:`GroupFailed` (with the batch document, so finished groups stay usable)
        if any group failed, :class:`DrCreditTimeout` after ``timeout`` seconds.
        """
        w = c.Waiter("batch", batch_id, timeout, poll_wait, progress)
        with w.bar:
            while True:
                try:
                    return w.finished(await self.batch_advantages(batch_id, wait=w.next_wait()))
                except NotReady as exc:
                    w.not_ready(exc)
                if w.wants_status():
                    w.saw_status(await self.batch_status(batch_id))
                w.check_deadline()
                await asyncio.sleep(w.pause())

    async def wait_for_audit(
        self, audit_id: str, *, timeout: float | None, poll_wait: float = 30.0, progress: bool = False
    ) -> JSONDict:
        """Long-poll until the audit is done and return its report.

        Raises :class:`AuditFailed` (with the ``reason``) if the audit failed and
        :class:`DrCreditTimeout` with its last status after ``timeout`` seconds (None waits
        forever). ``progress`` shows its status on stderr.
        """
        w = c.Waiter("audit", audit_id, timeout, poll_wait, progress)
        with w.bar:
            while True:
                try:
                    return w.finished(await self.get_audit(audit_id, wait=w.next_wait()))
                except NotReady as exc:
                    w.not_ready(exc)
                w.check_deadline()
                await asyncio.sleep(w.pause())
