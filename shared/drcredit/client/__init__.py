"""Client SDK of the DrCredit scoring service (the REST contract of docs/api.md), on httpx.

    from drcredit.client import DrCreditClient

    with DrCreditClient() as client:  # $DRCREDIT_URL, $DRCREDIT_API_KEY
        client.submit_group(group, group_id=f"{run}-step{step}-q{i}")
        doc = client.wait_for_advantages(f"{run}-step{step}-q{i}", timeout=600)

Choose ids you can recompute from your run: re-posting an id with the same content is
idempotent on the server (no new judge calls), so after a crash or a retried POST the
trainer gets the stored group back. :func:`new_group_id` makes a fresh one when needed;
``submit_batch`` gives a group without an id a fresh one before its first attempt, so
the SDK's own retries never judge a batch twice (ids from your run also cover retries
across processes).

Failed judgments reach you in the documents: ``unscorable`` on each turn, the counts in
``progress``; :func:`failed_judgments` and :func:`unscorable_turns` read them and the
``wait_for_*`` calls warn with :class:`JudgmentsFailed`.

Judge audits (docs/audit.md): ``start_audit``, ``get_audit``, ``wait_for_audit`` (raises
:class:`AuditFailed` with the reason) and ``list_audits``.
"""

from drcredit.client._requests import JSONDict, new_group_id
from drcredit.client.aio import AsyncDrCreditClient
from drcredit.client.errors import (
    AuditFailed,
    AuthError,
    BudgetExhausted,
    Conflict,
    DrCreditConnectionError,
    DrCreditError,
    DrCreditTimeout,
    GroupFailed,
    InvalidRequest,
    NotFound,
    NotReady,
    PayloadTooLarge,
    ServerError,
)
from drcredit.client.failures import JudgmentsFailed, failed_judgments, unscorable_turns
from drcredit.client.sync import DrCreditClient

__all__ = [
    "AsyncDrCreditClient",
    "AuditFailed",
    "AuthError",
    "BudgetExhausted",
    "Conflict",
    "DrCreditClient",
    "DrCreditConnectionError",
    "DrCreditError",
    "DrCreditTimeout",
    "GroupFailed",
    "InvalidRequest",
    "JSONDict",
    "JudgmentsFailed",
    "NotFound",
    "NotReady",
    "PayloadTooLarge",
    "ServerError",
    "failed_judgments",
    "new_group_id",
    "unscorable_turns",
]
