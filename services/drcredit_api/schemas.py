"""Response shapes, so that the served OpenAPI document describes every answer."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from drcredit.domain.group import Rollout


class Open(BaseModel):
    """A response shape that may carry more fields than it names."""

    model_config = ConfigDict(extra="allow")


class Accepted(Open):
    group_id: str
    status: str
    created: bool
    links: dict[str, str]


class RolloutAccepted(Open):
    group_id: str
    rollout_id: str
    status: str
    created: bool
    rollouts_received: int
    expected_rollouts: int


class BatchAccepted(Open):
    batch_id: str
    group_ids: list[str]
    created: bool
    links: dict[str, str]


class Progress(Open):
    judgments_total: int
    judgments_done: int
    judgments_failed: int
    judge_calls: int
    cache_hits: int
    deterministic_zeros: int
    snippet_calls_skipped: int


class Usage(Open):
    """What judging cost (docs/api.md, "Judge usage and cost")."""

    #: HTTP exchanges with the judge: every attempt, retries included.
    calls: int
    #: Judgments answered by a call of their own (not reused, not a deterministic zero).
    judgments: int
    prompt_tokens: int
    completion_tokens: int
    #: The part of prompt_tokens the server served from its prefix cache.
    cached_prompt_tokens: int
    #: The part of prompt_tokens the platform estimated (calls cut off before any usage).
    estimated_prompt_tokens: int
    #: Judgments answered from the tenant's store of earlier answers (no call, no tokens).
    reused: int = 0
    #: cached_prompt_tokens / prompt_tokens; null with no prompt tokens.
    cached_prompt_share: float | None = None
    #: At DRCREDIT_JUDGE_PRICE; null when no price is set.
    cost_usd: float | None


class UsagePerTrajectory(Open):
    """:class:`Usage` divided by trajectories: means."""

    calls: float
    judgments: float
    prompt_tokens: float
    completion_tokens: float
    cached_prompt_tokens: float
    estimated_prompt_tokens: float
    reused: float = 0.0
    #: A ratio (the sums' cached_prompt_tokens / prompt_tokens), not a mean per trajectory.
    cached_prompt_share: float | None = None
    cost_usd: float | None


class JudgeWait(Open):
    #: When the judge became unreachable for this group's judgments.
    since: str | None
    #: The judge's last error (connection refused, timeout, 503, ...).
    reason: str | None


class ConsumerWait(Open):
    #: The queue whose work the group waits on (visit_judge, snippet_matcher, outcome_judge, credit_aggregator).
    queue: str
    #: Since when: the later of its oldest waiting work and the last time a worker consumed the queue.
    since: str | None
    #: Work units of the group waiting on it (an aggregation counts as one).
    units: int


class GroupStatus(Open):
    group_id: str
    status: str
    batch_id: str | None
    error: str | None
    expected_rollouts: int
    rollouts_received: int
    progress: Progress
    #: The judge's usage so far.
    usage: Usage
    judge: dict[str, str]
    #: Set while the group's judgments wait for an unreachable judge.
    waiting_for_judge: JudgeWait | None = None
    #: Set while work of the group waits on a queue that no live worker consumes (distributed mode).
    waiting_for_consumer: list[ConsumerWait] | None = None
    #: Set while the group is held for its tenant's budget (status ``waiting_for_budget``).
    waiting_for_budget: BudgetWait | None = None
    metadata: Any
    created_at: str | None
    started_at: str | None
    finished_at: str | None


class TurnAdvantage(Open):
    index: int
    type: str
    #: Null on the final answer, and on an unscorable turn under ``exclude``.
    credit: float | None
    #: A_rg, the normalized credit (null on the final answer).
    process_advantage: float | None
    #: D, the discounted process advantage (equal to A_rg when ``discount`` is 0).
    discounted_process_advantage: float | None
    #: The fused advantage a trainer uses.
    advantage: float
    #: The credit depends on a failed judgment.
    unscorable: bool


class RolloutAdvantages(Open):
    id: str
    #: The trainer's reward, or the service's own (``outcome_source: judge``); null when
    #: that one is unscorable under ``exclude``.
    outcome_reward: float | None
    outcome_advantage: float
    #: ``outcome_source: judge``: the reward depends on a failed rubric judgment.
    outcome_unscorable: bool = False
    turns: list[TurnAdvantage]


class ScoredRollout(RolloutAdvantages):
    """A rollout of the advantages document (a replay's have no usage: it calls no judge)."""

    #: The judge's usage for this rollout's judgments (process and outcome).
    usage: Usage


class Stats(Open):
    mu_rg: float | None
    sigma_rg: float | None
    mu_o: float | None
    sigma_o: float | None


class AdvantagesProgress(Progress):
    unscorable_turns: int


class AdvantagesDocument(Open):
    group_id: str
    status: str
    params: dict[str, Any]
    stats: Stats
    #: The group's judgment counts, failures included.
    progress: AdvantagesProgress
    #: The group's usage: the sum of its rollouts'.
    usage: Usage
    rollouts: list[ScoredRollout]


class BatchAdvantages(Open):
    batch_id: str
    status: str
    groups: list[dict[str, Any]]


class BatchStatus(Open):
    batch_id: str
    status: str
    #: The sum of the groups' usage.
    usage: Usage
    groups: list[GroupStatus]


class CreditsDocument(Open):
    group_id: str
    #: done, or failed (then credits are null and ``error`` says why)
    status: str
    error: str | None = None
    params: dict[str, Any]
    rollouts: list[dict[str, Any]]


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    params: dict[str, Any] = {}


class Sensitivity(Open):
    turns: int
    wasserstein_1: float
    rmse: float
    process_sign_agreement: float
    fused_sign_agreement: float


class ReplayDocument(Open):
    group_id: str
    status: str
    params: dict[str, Any]
    stats: Stats
    rollouts: list[RolloutAdvantages]
    reference_params: dict[str, Any]
    exact: bool
    bounded_turns: list[dict[str, Any]]
    sensitivity: Sensitivity


class ErrorField(Open):
    #: The offending field's path (``rollouts[2].turns[4].pages[1].id``), or what the
    #: error is about (``group_id``, ``body``, ``authorization``, ``status``).
    field: str
    message: str


class ErrorBody(Open):
    """Every error answer: a message, and one item per field it names."""

    message: str
    detail: list[ErrorField]
    #: A 409 for a group not done yet: its status.
    status: str | None = None


RolloutIn = Rollout


class EvidencePoint(Open):
    budget: int
    cumulative: float | None
    rate: float | None
    rollouts: int


class EvidenceDocument(Open):
    group_id: str
    status: str
    points: list[EvidencePoint]


class RunSummary(Open):
    run: str
    groups: int
    steps: int
    first_at: str
    last_at: str


class RunList(Open):
    runs: list[RunSummary]


class JudgeLevels(Open):
    """The distribution of one kind's levels over the judgments the judge answered."""

    judgments: int
    counts: list[int]
    #: counts / judgments; null without a judgment.
    shares: list[float] | None


class StepDrift(Open):
    #: Total variation distance from the baseline; null for the first three steps, in a
    #: run of fewer than four, or without a judgment on either side.
    value: float | None
    flagged: bool


class DriftBaseline(Open):
    threshold: float
    #: The run's first three numbered steps (empty in a run of fewer than four).
    steps: list[int]
    #: Their judgments pooled, per kind; null in a run of fewer than four steps.
    judge_levels: dict[str, JudgeLevels] | None


class RunStep(Open):
    step: int | None
    groups: int
    groups_done: int
    groups_failed: int
    batches: list[str]
    group_ids: list[str]
    trajectories: int
    judge_calls: dict[str, float | None]
    #: The judge's usage for every group of the step (failed ones too).
    usage: Usage
    #: The done groups' usage over their trajectories; null without one.
    usage_per_trajectory: UsagePerTrajectory | None
    failed_judgments: int
    unscorable_turns: int
    latency_per_trajectory_s: dict[str, float] | None
    mean_credit: float | None
    zero_credit_share: float | None
    evidence: list[EvidencePoint]
    process_advantage: dict[str, Any]
    #: Per kind (visit, report_rubric): the levels the judge gave in the step; null for a
    #: step without a number.
    judge_levels: dict[str, JudgeLevels] | None = None
    #: Per kind: the step's drift from the run's first three steps, and whether it is flagged.
    drift: dict[str, StepDrift] | None = None


class Workload(Open):
    """The run's scoring workload row: per-step values averaged over the scored steps."""

    steps: int
    trajectories: int
    process_judge_tasks_per_trajectory: float | None
    outcome_judge_tasks_per_trajectory: float | None
    scoring_latency_per_trajectory_s: float | None
    usage_per_trajectory: UsagePerTrajectory | None
    #: The run's usage in all.
    usage: Usage


class RunDocument(Open):
    run: str
    budgets: list[int]
    workload: Workload
    drift_baseline: DriftBaseline | None = None
    steps: list[RunStep]


class SensitivityScenario(Open):
    batch_id: str | None = None
    params: dict[str, Any]
    exact: bool
    bounded_turns: int
    sensitivity: Sensitivity | None


class NamedScenario(SensitivityScenario):
    name: str


class SensitivityTable(Open):
    batch_id: str
    groups: int
    groups_in_batch: int
    scenarios: list[NamedScenario]


# ---------------------------------------------------------------------- tenants


class BudgetWait(Open):
    """A group or judge audit accepted past its tenant's budget (``on_budget: wait``): sent at the reset."""

    budget: str
    resets_at: str
