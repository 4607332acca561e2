"""Response shapes of the judge audits (the served OpenAPI document describes them)."""

from __future__ import annotations

from typing import Any

from drcredit_api.schemas import BudgetWait, Open


class AuditSummary(Open):
    audit_id: str
    #: queued | waiting_for_budget | running | done | failed
    status: str
    judge: str
    judge_model: str | None = None
    scope: dict[str, Any]
    sample_groups: int | None = None
    seed: int
    group_ids: list[str]
    error: str | None = None
    #: Set while the audit is held for its tenant's budget (status ``waiting_for_budget``).
    waiting_for_budget: BudgetWait | None = None
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None


class Marginals(Open):
    """Each side's share of its paired values in each category 0..m."""

    original: list[float]
    audit: list[float]


class KindAgreement(Open):
    pairs: int
    left_out: int
    exact: float | None
    kappa: float | None
    confusion: list[list[int]]
    #: Mean of (audit - original) over the pairs, in the kind's units; null without a pair.
    bias: float | None = None
    marginals: Marginals | None = None


class AuditEffect(Open):
    turns: int
    w1: float
    rmse: float
    fused_w1: float
    fused_rmse: float
    process_sign_agreement: float
    fused_sign_agreement: float
    outcome_rmse: float | None = None


class AuditDocument(AuditSummary):
    agreement: dict[str, KindAgreement]
    #: Null for an audit against people's labels (no second set of advantages).
    effect: AuditEffect | None
    usage: dict[str, Any]
    #: An audit against people's labels: each labeler's count of labels, and the
    #: agreement of each pair of labelers (the first by name order as the original).
    labelers: dict[str, Any] | None = None


class AuditList(Open):
    audits: list[AuditSummary]
