"""Exceptions of the client SDK, one per way a call can fail.

Every error keeps what the server said (``message``, ``detail`` and the whole ``body``),
so that a trainer's log shows the service's own explanation rather than a bare status
code. Catch :class:`DrCreditError` for everything, or a subclass for one case.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

__all__ = [
    "AuditFailed",
    "AuthError",
    "BudgetExhausted",
    "Conflict",
    "DrCreditConnectionError",
    "DrCreditError",
    "DrCreditTimeout",
    "GroupFailed",
    "InvalidRequest",
    "NotFound",
    "NotReady",
    "PayloadTooLarge",
    "ServerError",
    "error_for_response",
]


class DrCreditError(Exception):
    """An error answer of the service (or, with ``status_code`` None, a client-side failure).

    ``attempts`` is how many times the request was sent before giving up; it is more than
    one only for retried answers (5xx) and connection failures.
    """

    def __init__(
        self,
        status_code: int | None,
        message: str,
        detail: Any = None,
        body: Any = None,
        *,
        attempts: int = 1,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.detail = detail
        self.body = body
        self.attempts = attempts

    def __str__(self) -> str:
        if self.status_code is None:
            return self.message
        return f"HTTP {self.status_code}: {self.message}"


class AuthError(DrCreditError):
    """401: the API key is missing or not one the service knows."""


class NotFound(DrCreditError):
    """404: no such group or batch for this API key's tenant."""


class Conflict(DrCreditError):
    """409: the id exists with different content, or the request does not fit the group's state."""


class NotReady(DrCreditError):
    """409 with a ``status``: the group or batch has not finished (``status`` says where it is)."""

    def __init__(
        self,
        status_code: int | None,
        message: str,
        detail: Any = None,
        body: Any = None,
        *,
        status: str,
        attempts: int = 1,
    ) -> None:
        super().__init__(status_code, message, detail, body, attempts=attempts)
        self.status = status


class InvalidRequest(DrCreditError):
    """422: the input is malformed; ``errors`` lists each ``{"field", "message"}`` the server named."""

    def __init__(
        self,
        status_code: int | None,
        message: str,
        detail: Any = None,
        body: Any = None,
        *,
        errors: list[dict[str, str]],
        attempts: int = 1,
    ) -> None:
        super().__init__(status_code, message, detail, body, attempts=attempts)
        self.errors = errors

    @property
    def fields(self) -> list[str]:
        """The offending field paths, e.g. ``rollouts[1].id``."""
        return [e["field"] for e in self.errors]

    def __str__(self) -> str:
        if not self.errors:
            return super().__str__()
        lines = [f"{e['field']}: {e['message']}" for e in self.errors]
        return f"HTTP {self.status_code}: invalid request\n" + "\n".join(lines)


class PayloadTooLarge(DrCreditError):
    """413: the body exceeds the service's DRCREDIT_MAX_BODY_BYTES; split the batch."""


class ServerError(DrCreditError):
    """5xx that persisted through every retry."""


class BudgetExhausted(DrCreditError):
    """429: the tenant's budget is used up (``on_budget: refuse``): ``budget``, ``limit``,
    ``used``, ``resets_at`` (ISO 8601, UTC) and ``retry_after`` (seconds) say which and
    until when. Not retried: the wait is until the budget's window resets."""

    def __init__(self, *args: Any, error: dict[str, Any], retry_after: float | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.budget = str(error.get("budget"))
        self.limit = error.get("limit")
        self.used = error.get("used")
        self.resets_at = str(error.get("resets_at"))
        self.retry_after = retry_after


class DrCreditConnectionError(DrCreditError, ConnectionError):
    """The service could not be reached (refused, reset, timed out) after every retry."""

    def __init__(self, message: str, *, attempts: int = 1) -> None:
        super().__init__(None, message, attempts=attempts)


class DrCreditTimeout(DrCreditError, TimeoutError):
    """A ``wait_for_*`` call ran out of time; ``status`` and ``document`` are the last known state."""

    def __init__(self, message: str, *, status: str | None, document: dict[str, Any] | None = None) -> None:
        super().__init__(None, message, body=document)
        self.status = status
        self.document = document


class GroupFailed(DrCreditError):
    """A group ended ``failed`` (e.g. a judgment failed under ``on_judge_failure: fail``).

    ``group_ids`` names the failed groups; for a batch, ``document`` is the batch's
    advantages, so the groups that did finish can still be used.
    """

    def __init__(self, message: str, *, group_ids: list[str], document: dict[str, Any] | None = None) -> None:
        super().__init__(None, message, body=document)
        self.group_ids = group_ids
        self.document = document


class AuditFailed(DrCreditError):
    """A judge audit ended ``failed``: ``reason`` is why (an audit judge that stayed
    unreachable, a sampled group that is gone); the training groups are untouched."""

    def __init__(self, message: str, *, audit_id: str, reason: str) -> None:
        super().__init__(None, message)
        self.audit_id = audit_id
        self.reason = reason


def _field_errors(detail: Any) -> list[dict[str, str]]:
    if not isinstance(detail, list):
        return []
    out = []
    for item in detail:
        if isinstance(item, dict):
            out.append({"field": str(item.get("field", "")), "message": str(item.get("message", ""))})
    return out


def error_for_response(status_code: int, body: Any, text: str, *, attempts: int = 1) -> DrCreditError:
    """The exception for an error answer, keeping the server's own message."""
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        message = body["message"]
    elif isinstance(detail, str):
        message = detail
    else:
        message = text.strip() or f"HTTP {status_code}"
    if status_code == 401:
        return AuthError(status_code, message, detail, body, attempts=attempts)
    if status_code == 404:
        return NotFound(status_code, message, detail, body, attempts=attempts)
    if status_code == 409:
        status = body.get("status") if isinstance(body, dict) else None
        if isinstance(status, str):
            return NotReady(status_code, message, detail, body, status=status, attempts=attempts)
        return Conflict(status_code, message, detail, body, attempts=attempts)
    if status_code == 413:
        return PayloadTooLarge(status_code, message, detail, body, attempts=attempts)
    if status_code == 422:
        return InvalidRequest(status_code, message, detail, body, errors=_field_errors(detail), attempts=attempts)
    if status_code == 429 and isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        retry_after = None
        if error.get("resets_at"):
            message = f"{message} (resets at {error['resets_at']})"
            try:
                resets = datetime.fromisoformat(str(error["resets_at"]))
                retry_after = max(0.0, (resets - datetime.now(UTC)).total_seconds())
            except (TypeError, ValueError):
                pass
        return BudgetExhausted(
            status_code, message, detail, body, error=error, retry_after=retry_after, attempts=attempts
        )
    if status_code >= 500:
        return ServerError(status_code, message, detail, body, attempts=attempts)
    return DrCreditError(status_code, message, detail, body, attempts=attempts)
