"""What the sync and async clients share: configuration, retries, error mapping and the
decisions of the long-poll loops (the requests themselves: :mod:`drcredit.client._requests`).

The two clients only perform I/O (``httpx.Client`` or ``httpx.AsyncClient``, ``time.sleep``
or ``asyncio.sleep``); every rule lives here once, so they cannot drift apart.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from tenacity import RetryCallState, retry_if_exception_type, stop_after_attempt

import drcredit
from drcredit.client._requests import Call, JSONDict
from drcredit.client.errors import (
    AuditFailed,
    DrCreditConnectionError,
    DrCreditError,
    DrCreditTimeout,
    GroupFailed,
    NotReady,
    error_for_response,
)
from drcredit.client.failures import warn_on_failures

ENV_URL = "DRCREDIT_URL"
ENV_API_KEY = "DRCREDIT_API_KEY"
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_S = 30.0

#: Never poll faster than this, even when the server's long-poll cap is short.
MIN_POLL_INTERVAL_S = 0.25
#: With a progress bar, long-poll in chunks this short so the bar moves.
PROGRESS_TICK_S = 1.0
FINAL = ("done", "failed")


# ---------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter; ``max_attempts`` counts the first try."""

    max_attempts: int = 4
    backoff_initial: float = 0.5
    backoff_max: float = 8.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.backoff_initial < 0 or self.backoff_max < 0:
            raise ValueError("backoffs must not be negative")


@dataclass(frozen=True)
class ClientConfig:
    base_url: str
    headers: dict[str, str]
    timeout: httpx.Timeout
    retry: RetryPolicy

    @classmethod
    def create(
        cls,
        base_url: str | None,
        api_key: str | None,
        timeout: float | httpx.Timeout | None,
        retry: RetryPolicy,
        headers: Mapping[str, str] | None,
    ) -> ClientConfig:
        url = (base_url or os.environ.get(ENV_URL) or DEFAULT_URL).rstrip("/")
        key = api_key if api_key is not None else os.environ.get(ENV_API_KEY)
        merged = {"User-Agent": f"drcredit-client/{drcredit.__version__}", "Accept": "application/json"}
        if key:
            merged["Authorization"] = f"Bearer {key}"
        merged.update(headers or {})
        return cls(url, merged, timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout), retry)

    def timeout_for(self, call: Call) -> httpx.Timeout:
        """The client's timeout, with the read timeout stretched by a long-poll's wait."""
        t = self.timeout
        if not call.wait or t.read is None:
            return t
        return httpx.Timeout(connect=t.connect, read=t.read + call.wait, write=t.write, pool=t.pool)

    def retrying(self, call: Call) -> dict[str, Any]:
        """Keyword arguments for tenacity's ``Retrying``/``AsyncRetrying`` for this call."""
        return {
            "stop": stop_after_attempt(self.retry.max_attempts if call.retry else 1),
            "wait": _Backoff(self.retry),
            "retry": retry_if_exception_type(TRANSIENT),
            "reraise": True,
        }


class _Backoff:
    """Exponential backoff with jitter, stretched to a 503's ``Retry-After`` (up to the max).

    Attempt n waits ``initial * 2**(n-1)`` plus up to ``initial`` of jitter, capped at
    ``backoff_max``; the jitter keeps many trainer processes from retrying in lockstep.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy

    def __call__(self, state: RetryCallState) -> float:
        p = self.policy
        exponent = min(state.attempt_number - 1, 62)
        delay = min(p.backoff_initial * 2.0**exponent + random.uniform(0, p.backoff_initial), p.backoff_max)
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, Transient) and exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, p.backoff_max))
        return delay


class Transient(Exception):
    """A 5xx answer, raised inside the retry loop so tenacity retries it."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response
        self.retry_after: float | None = None
        header = response.headers.get("retry-after")
        if header:
            try:
                self.retry_after = max(0.0, float(header))
            except ValueError:
                self.retry_after = None


TRANSIENT: tuple[type[BaseException], ...] = (
    Transient,
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)


def check_transient(response: httpx.Response, call: Call) -> httpx.Response:
    if response.status_code >= 500 and response.status_code not in call.accept:
        raise Transient(response)
    return response


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def finish(response: httpx.Response, call: Call, attempts: int = 1) -> Any:
    """The decoded answer, or the typed error for an error status."""
    status = response.status_code
    if 200 <= status < 300 or status in call.accept:
        if call.text:
            return response.text
        try:
            return response.json()
        except ValueError:
            raise DrCreditError(
                status, "the service answered with a body that is not JSON", body=response.text
            ) from None
    raise error_for_response(status, _body(response), response.text, attempts=attempts)


def json_object(value: Any) -> JSONDict:
    if not isinstance(value, dict):
        raise DrCreditError(None, f"expected a JSON object from the service, got {type(value).__name__}", body=value)
    return value


def give_up(exc: BaseException, call: Call, base_url: str, attempts: int) -> DrCreditError:
    """The error to raise once retries are exhausted (or not allowed)."""
    if isinstance(exc, Transient):
        return error_for_response(exc.response.status_code, _body(exc.response), exc.response.text, attempts=attempts)
    what = "timed out" if isinstance(exc, httpx.TimeoutException) else "failed"
    detail = str(exc) or type(exc).__name__
    return DrCreditConnectionError(
        f"{call.method} {base_url}{call.path} {what} after {attempts} attempt(s): {detail}", attempts=attempts
    )


# ---------------------------------------------------------------------------- waiting


class ProgressBar:
    """A rich progress bar on stderr when enabled; otherwise every method does nothing."""

    def __init__(self, enabled: bool, description: str, unit: str) -> None:
        self.enabled = enabled
        self._progress: Progress | None = None
        self._description = description
        if enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn(unit),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._task = self._progress.add_task(description, total=None, status="")

    def __enter__(self) -> ProgressBar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    def show(self, done: int, total: int | None, status: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total or None, status=status)

    def complete(self) -> None:
        if self._progress is not None:
            task = self._progress.tasks[0]
            total = int(task.total) if task.total else 1
            self._progress.update(self._task, completed=total, total=total, status="done")


def _consumer_waits(kind: str, document: JSONDict | None) -> str:
    """What a timed-out wait says of queues no live worker consumes (the status's
    ``waiting_for_consumer``): a deployment missing a worker service, not a slow judge."""
    if document is None:
        return ""
    statuses = [document] if kind == "group" else list(document.get("groups") or [])
    queues = sorted({w["queue"] for s in statuses for w in (s.get("waiting_for_consumer") or [])})
    if not queues:
        return ""
    names = ", ".join(queues)
    return f"; its work waits on {names}, which no live worker consumes (drcredit worker --queues {','.join(queues)})"


def _budget_waits(kind: str, document: JSONDict | None) -> str:
    """What a timed-out wait says of groups held for the tenant's budget (the status's
    ``waiting_for_budget``): judging starts when the budget resets, not before."""
    if document is None:
        return ""
    statuses = [document] if kind == "group" else list(document.get("groups") or [])
    held = [s["waiting_for_budget"] for s in statuses if s.get("waiting_for_budget")]
    if not held:
        return ""
    last = max(held, key=lambda w: str(w.get("resets_at")))
    return (
        f"; {len(held)} group(s) waiting_for_budget: the tenant's {last.get('budget')} is used up,"
        f" judging starts when it resets at {last.get('resets_at')}"
    )


@dataclass
class Waiter:
    """The decisions of ``wait_for_advantages`` / ``wait_for_batch`` / ``wait_for_audit``;
    the clients do the I/O.

    Each round long-polls for at most ``min(poll_wait, remaining)`` seconds (a progress bar
    shortens rounds so it moves), fetches the status when a bar is shown or time is up
    (an audit's status comes with its ``409``), and raises :class:`DrCreditTimeout` with
    that status once the deadline has passed.
    """

    kind: str  # "group" | "batch" | "audit"
    ident: str
    timeout: float | None
    poll_wait: float
    progress: bool
    status: str | None = None
    document: JSONDict | None = None
    started: float = field(default_factory=time.monotonic)
    bar: ProgressBar = field(init=False)

    def __post_init__(self) -> None:
        if self.timeout is not None and (self.timeout < 0 or math.isnan(self.timeout)):
            raise ValueError("timeout must be a non-negative number of seconds (or None to wait forever)")
        if self.poll_wait <= 0:
            raise ValueError("poll_wait must be positive")
        unit = "judgments" if self.kind == "group" else "groups"
        self.bar = ProgressBar(self.progress, f"{self.kind} {self.ident}", unit)
        self.round_started = self.started

    def remaining(self) -> float:
        if self.timeout is None:
            return math.inf
        return max(0.0, self.started + self.timeout - time.monotonic())

    def next_wait(self) -> float:
        self.round_started = time.monotonic()
        chunk = min(self.poll_wait, PROGRESS_TICK_S) if self.progress else self.poll_wait
        return max(0.0, min(chunk, self.remaining()))

    def finished(self, document: JSONDict) -> JSONDict:
        """The final document; raises :class:`GroupFailed` when a batch holds failed groups,
        and warns (:class:`~drcredit.client.failures.JudgmentsFailed`) when judgments failed."""
        if self.kind == "audit":
            sampled = len(document.get("group_ids") or [])
            self.bar.show(sampled, sampled, "done")
            return document
        if self.kind == "batch":
            groups = [g for g in document.get("groups", []) if isinstance(g, dict)]
            self.bar.show(len(groups), len(groups), str(document.get("status")))
            failed = [g for g in groups if g.get("status") == "failed"]
            if failed:
                lines = "; ".join(f"{g.get('group_id')}: {g.get('error')}" for g in failed)
                raise GroupFailed(
                    f"batch {self.ident!r}: {len(failed)} of {len(groups)} group(s) failed: {lines}",
                    group_ids=[str(g.get("group_id")) for g in failed],
                    document=document,
                )
        self.bar.complete()
        warn_on_failures(document)
        return document

    def not_ready(self, exc: NotReady) -> None:
        if exc.status == "waiting_for_budget" and self.status != exc.status:
            # Said once: the wait is for the tenant's budget to reset, not for the judge.
            logging.getLogger("drcredit.client").warning("%s", exc.message)
        self.status = exc.status
        if self.kind == "audit":
            self.bar.show(0, None, exc.status)
            if exc.status == "failed":
                prefix = f"audit {self.ident!r} is failed: "
                reason = exc.message[len(prefix) :] if exc.message.startswith(prefix) else exc.message
                raise AuditFailed(exc.message, audit_id=self.ident, reason=reason) from exc
            return
        if exc.status == "failed":
            raise GroupFailed(exc.message, group_ids=[self.ident], document=None) from exc

    def wants_status(self) -> bool:
        if self.kind == "audit":
            return False  # its 409 said the status; there is nothing more to read
        return self.progress or self.remaining() <= 0

    def saw_status(self, document: JSONDict) -> None:
        self.document = document
        self.status = str(document.get("status"))
        if self.kind == "group":
            p = document.get("progress") or {}
            self.bar.show(int(p.get("judgments_done", 0)), int(p.get("judgments_total", 0)), self.status)
        else:
            groups = document.get("groups") or []
            done = sum(1 for g in groups if g.get("status") in FINAL)
            self.bar.show(done, len(groups), self.status)

    def check_deadline(self) -> None:
        if self.remaining() > 0:
            return
        detail = ""
        if self.kind == "group" and self.document is not None:
            p = self.document.get("progress") or {}
            detail = f", {p.get('judgments_done')}/{p.get('judgments_total')} judgments"
        elif self.document is not None:
            groups = self.document.get("groups") or []
            done = sum(1 for g in groups if g.get("status") in FINAL)
            detail = f", {done}/{len(groups)} groups finished"
        detail += _consumer_waits(self.kind, self.document)
        detail += _budget_waits(self.kind, self.document)
        raise DrCreditTimeout(
            f"{self.kind} {self.ident!r} not finished after {self.timeout}s (status {self.status}{detail})",
            status=self.status,
            document=self.document,
        )

    def pause(self) -> float:
        """Seconds to sleep before the next round, so a short server-side wait cap is not hammered."""
        elapsed = time.monotonic() - self.round_started
        return max(0.0, min(MIN_POLL_INTERVAL_S - elapsed, self.remaining()))
