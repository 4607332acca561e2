"""Prometheus metrics shared by the API and the workers (one registry per process)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

JUDGE_CALLS = Counter(
    "drcredit_judge_calls_total", "Judge calls by backend, kind and outcome", ["backend", "kind", "outcome"]
)
JUDGE_ATTEMPTS = Counter(
    "drcredit_judge_attempts_total", "Judge HTTP attempts by backend, kind and outcome", ["backend", "kind", "outcome"]
)
JUDGE_LATENCY = Histogram(
    "drcredit_judge_latency_seconds",
    "Latency of one judgment including its retries",
    ["backend", "kind"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128),
)
JUDGE_TOKENS = Counter(
    "drcredit_judge_tokens_total",
    "Judge tokens by kind and direction (prompt, completion; cached_prompt: the part of prompt the server's cache served)",
    ["backend", "kind", "direction"],
)
JUDGE_COST = Counter(
    "drcredit_judge_cost_usd_total",
    "What the judge's tokens cost at DRCREDIT_JUDGE_PRICE (absent: no price set)",
    ["backend", "kind"],
)
JUDGE_CACHE_HITS = Counter("drcredit_judge_cache_hits_total", "Judgments reused from an identical request", ["kind"])
DETERMINISTIC_ZEROS = Counter("drcredit_deterministic_zero_judgments_total", "Visit judgments made without a call")
SNIPPET_SKIPS = Counter("drcredit_snippet_calls_skipped_total", "Snippet calls skipped under saturation")
UNITS = Counter("drcredit_work_units_total", "Work units run, by kind and outcome", ["kind", "outcome"])
CHAINS_IN_FLIGHT = Gauge("drcredit_chains_in_flight", "Visit chains being judged right now in this process")
GROUPS_FINISHED = Counter("drcredit_groups_finished_total", "Groups that reached a final status", ["status"])
GROUPS_INGESTED = Counter("drcredit_groups_ingested_total", "Groups accepted by ingest (new, not re-posts)")
GROUP_LATENCY = Histogram(
    "drcredit_group_latency_seconds",
    "From ingest of a group to its advantages",
    buckets=(0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
)
GROUPS_BY_STATUS = Gauge("drcredit_groups", "Groups in the database by status", ["status"])
QUEUE_DEPTH = Gauge("drcredit_queue_depth", "Messages waiting in each broker queue", ["queue"])
QUEUE_CONSUMERS = Gauge(
    "drcredit_queue_consumers",
    "Live workers consuming each queue (set by the API; 0: nothing takes its work)",
    ["queue"],
)
GROUPS_WAITING_FOR_CONSUMER = Gauge(
    "drcredit_groups_waiting_for_consumer",
    "Open groups with work waiting on each queue that no live worker consumes (set by the API)",
    ["queue"],
)
TASKS = Counter("drcredit_tasks_total", "Celery tasks by queue and outcome", ["queue", "outcome"])
JUDGE_OUTAGES = Counter(
    "drcredit_judge_outages_total", "Times a judge endpoint became unreachable (its breaker opened)", ["endpoint"]
)
JUDGE_UP = Gauge("drcredit_judge_up", "1 while the judge endpoint is reachable from this process, else 0", ["endpoint"])
JUDGE_ENDPOINT_RESPONSES = Counter(
    "drcredit_judge_endpoint_responses_total",
    "Exchanges with each judge endpoint by outcome (answered, rate_limited = 429, connection, timeout, server_error)",
    ["endpoint", "outcome"],
)
JUDGE_ENDPOINT_IN_FLIGHT = Gauge(
    "drcredit_judge_endpoint_in_flight", "Calls in flight to each judge endpoint from this process", ["endpoint"]
)
JUDGE_ENDPOINT_LIMIT = Gauge(
    "drcredit_judge_endpoint_limit",
    "The learned limit of calls in flight to each judge endpoint, fleet-wide (all processes)",
    ["endpoint"],
)
JUDGE_ENDPOINT_SHARE = Gauge(
    "drcredit_judge_endpoint_share", "This process's part of each judge endpoint's limit", ["endpoint"]
)
JUDGE_ENDPOINT_UP = Gauge(
    "drcredit_judge_endpoint_up", "1 while the judge endpoint is in this process's rotation, else 0", ["endpoint"]
)
JUDGE_ENDPOINT_LATENCY = Gauge(
    "drcredit_judge_endpoint_latency_seconds", "Smoothed latency of each judge endpoint's answers", ["endpoint"]
)
JUDGE_ENDPOINT_RPM = Gauge(
    "drcredit_judge_endpoint_requests_per_minute",
    "The pace calls to each judge endpoint are held to (its declared or inferred rate limit; absent: none)",
    ["endpoint"],
)
ROLLOUT_CACHE_BYTES = Gauge(
    "drcredit_rollout_cache_bytes",
    "Stored JSON size of the rollout content this process keeps (DRCREDIT_ROLLOUT_CACHE_MB bounds it)",
)
SWEEPS = Counter("drcredit_sweep_redispatched_total", "Work units re-dispatched by the sweeper")

# Named here first so that the code, the Grafana dashboard and the alert rules agree on one name
# each: the calls the fleet holds back, answers reused from identical requests, each tenant's use
# of the judge and its budgets, and the drift of a run's judgments.
JUDGE_CALLS_WAITING = Gauge(
    "drcredit_judge_calls_waiting", "Judge calls this process holds back, waiting for a place on an endpoint"
)
JUDGE_REUSED = Counter(
    "drcredit_judge_reused_total", "Judgments answered from an identical request answered before (no call)", ["kind"]
)
TENANT_JUDGE_CALLS = Counter("drcredit_tenant_judge_calls_total", "Judge calls made for each tenant", ["tenant"])
TENANT_JUDGE_TOKENS = Counter(
    "drcredit_tenant_judge_tokens_total",
    "Judge tokens spent for each tenant by direction (prompt, completion, cached_prompt)",
    ["tenant", "direction"],
)
TENANT_JUDGE_COST = Counter(
    "drcredit_tenant_judge_cost_usd_total", "What each tenant's judge tokens cost at DRCREDIT_JUDGE_PRICE", ["tenant"]
)
TENANT_CALLS_WAITING = Gauge(
    "drcredit_tenant_calls_waiting", "Judge calls of each tenant waiting for their share of the fleet", ["tenant"]
)
TENANT_FLEET_SHARE = Gauge(
    "drcredit_tenant_fleet_share", "Each tenant's share of the judge calls served over the last minute", ["tenant"]
)
TENANT_BUDGET_USED = Gauge(
    "drcredit_tenant_budget_used_ratio",
    "Part of each tenant budget used in its current window (1: spent)",
    ["tenant", "budget"],
)
RUN_DRIFT = Gauge(
    "drcredit_run_drift",
    "Total variation distance of a run's latest step's judge levels from its first three steps",
    ["tenant", "run", "kind"],
)
RUN_DRIFT_FLAGGED = Gauge(
    "drcredit_run_drift_flagged", "1 while a run's latest step drifted past drift_threshold", ["tenant", "run", "kind"]
)

# Read from the database by the API when /metrics is scraped (drcredit_api.run_metrics).
STEPS_IN_FLIGHT = Gauge("drcredit_steps_in_flight", "Steps of training runs with a group neither done nor failed")
RUN_LATEST_STEP_SECONDS = Gauge(
    "drcredit_run_latest_step_seconds",
    "Wall time of each recent run's latest finished step: its first group's arrival to its last group's end",
    ["tenant", "run"],
)
GROUPS_JUDGED_NOT_DONE = Gauge(
    "drcredit_groups_judged_not_done",
    "Open groups whose work units all finished more than 5 minutes ago, their advantages still not made",
)


@lru_cache(maxsize=512)
def _judgment_children(backend: str, kind: str, status: str) -> tuple[Any, Any, Any, Any, Any]:
    # A labelled child is the same object for the same labels; looking it up takes a
    # lock and a few dict operations, five times per judge call without this cache.
    return (
        JUDGE_CALLS.labels(backend, kind, status),
        JUDGE_LATENCY.labels(backend, kind),
        JUDGE_TOKENS.labels(backend, kind, "prompt"),
        JUDGE_TOKENS.labels(backend, kind, "completion"),
        JUDGE_TOKENS.labels(backend, kind, "cached_prompt"),
    )


@lru_cache(maxsize=512)
def _cost_child(backend: str, kind: str) -> Any:
    return JUDGE_COST.labels(backend, kind)


@lru_cache(maxsize=512)
def _attempt_child(backend: str, kind: str, outcome: str) -> Any:
    return JUDGE_ATTEMPTS.labels(backend, kind, outcome)


def observe_judgment(
    backend: str,
    kind: str,
    status: str,
    latency_s: float,
    prompt_tokens: int,
    completion_tokens: int,
    attempt_outcomes: Iterable[str],
    cached_tokens: int = 0,
    cost_usd: float | None = None,
) -> None:
    """Count one judgment: call, latency, tokens, cost (with a price) and each attempt's outcome."""
    calls, latency, prompt, completion, cached = _judgment_children(backend, kind, status)
    calls.inc()
    latency.observe(latency_s)
    prompt.inc(prompt_tokens)
    completion.inc(completion_tokens)
    cached.inc(cached_tokens)
    if cost_usd is not None:
        _cost_child(backend, kind).inc(cost_usd)
    for outcome in attempt_outcomes:
        _attempt_child(backend, kind, outcome).inc()


@lru_cache(maxsize=512)
def _tenant_children(tenant: str) -> tuple[Any, Any, Any, Any, Any]:
    return (
        TENANT_JUDGE_CALLS.labels(tenant),
        TENANT_JUDGE_TOKENS.labels(tenant, "prompt"),
        TENANT_JUDGE_TOKENS.labels(tenant, "completion"),
        TENANT_JUDGE_TOKENS.labels(tenant, "cached_prompt"),
        TENANT_JUDGE_COST.labels(tenant),
    )


def observe_tenant(
    tenant: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int, cost_usd: float | None
) -> None:
    """Count one judge call of ``tenant``: its tokens and (with a price) their cost."""
    calls, prompt, completion, cached, cost = _tenant_children(tenant)
    calls.inc()
    prompt.inc(prompt_tokens)
    completion.inc(completion_tokens)
    cached.inc(cached_tokens)
    if cost_usd is not None:
        cost.inc(cost_usd)
