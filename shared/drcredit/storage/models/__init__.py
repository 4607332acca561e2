"""Database tables. SQLite (embedded) and Postgres (deployment) share one schema.

Judgments are unique per (group, kind, rollout, turn, rubric) so that a redelivered task
can never store a second answer for the same question; every attempt of a judgment is
kept in its row, and a rubric's support history is read from its visit judgments
(drcredit.storage.histories). Credits and advantages live on the turn rows they describe.

One module per concern (the scoring tables, the judge's, the audit's, the tenants'
ledger); every table is importable from here, as ``models.Judgment``.
"""

from drcredit.storage.models.audit import Audit, AuditGroup, Label, Replay
from drcredit.storage.models.base import NAMING, Base, utcnow
from drcredit.storage.models.groups import Batch, Group, Judgment, RequestClaim, Rollout, Turn, WorkUnit
from drcredit.storage.models.judge import JudgeAnswer, JudgeEndpoint
from drcredit.storage.models.tenancy import TenantUsage

__all__ = [
    "NAMING",
    "Audit",
    "AuditGroup",
    "Base",
    "Batch",
    "Group",
    "JudgeAnswer",
    "JudgeEndpoint",
    "Judgment",
    "Label",
    "Replay",
    "RequestClaim",
    "Rollout",
    "TenantUsage",
    "Turn",
    "WorkUnit",
    "utcnow",
]
