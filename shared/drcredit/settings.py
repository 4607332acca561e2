"""Configuration from the environment (``DRCREDIT_*``), with embedded defaults.

With nothing set the platform runs on one machine: an SQLite file under the data
directory, in-process execution and the offline judge.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from drcredit.domain.drift import DEFAULT_DRIFT_THRESHOLD
from drcredit.domain.limits import Limits
from drcredit.domain.usage import JudgePrice, parse_price
from drcredit.tenancy.policy import TENANTS_SETTING, TenantPolicy, parse_tenants


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DRCREDIT_", extra="ignore")

    # Judge -----------------------------------------------------------------
    judge: Literal["offline", "openai"] = "offline"
    #: One endpoint, a comma-separated list of endpoints serving the same model, or a
    #: JSON list of objects with per-endpoint keys, weights and caps
    #: (:mod:`drcredit.judges.fleet.endpoints`).
    judge_base_url: str | None = None
    #: Required for ``openai`` (the served model's name); the offline backend names itself.
    judge_model: str | None = None
    judge_api_key: str | None = None
    #: How long an answer may take once the call is sent (calls wait for a free place
    #: in the platform, not in the judge's queue).
    judge_timeout_s: float = Field(120.0, gt=0)
    #: How long opening a connection may take, apart from the answer.
    judge_connect_timeout_s: float = Field(5.0, gt=0)
    #: Requests and tokens per minute across every process of the deployment (a hosted
    #: judge's quota); unset: only what the endpoints report in their headers.
    judge_rpm: float | None = Field(None, gt=0)
    judge_tpm: float | None = Field(None, gt=0)
    judge_max_tokens: int = Field(1024, gt=0)
    judge_temperature: float = 0.0
    judge_response_format: Literal["auto", "json_schema", "json_object", "none"] = "auto"
    judge_extra_body: dict[str, Any] = Field(default_factory=dict)
    judge_max_attempts: int = Field(4, ge=1, le=20)
    judge_backoff_initial_s: float = Field(0.5, ge=0)
    judge_backoff_max_s: float = Field(20.0, ge=0)
    #: How long work waits for a judge that cannot be reached (connection errors,
    #: timeouts, 5xx or 429 outlasting a judgment's retries) before its group fails.
    judge_outage_deadline_s: float = Field(600.0, gt=0)
    #: The most judge calls in flight at once in one process (the API in embedded mode,
    #: a worker); below it the platform learns what each endpoint serves
    #: (:mod:`drcredit.judges.fleet.limits`), shared by every process of a deployment.
    judge_concurrency: int = Field(1024, ge=1, le=8192)
    #: How long an idle connection to the judge is kept for reuse. Shorter than the
    #: judge server's own keep-alive timeout (5 s for uvicorn-based servers such as
    #: vLLM and SGLang): a connection the server has just closed, reused at the start
    #: of the next step, fails its request and costs a retry with backoff.
    judge_keepalive_s: float = Field(4.0, gt=0)
    #: USD per million prompt, cached prompt and completion tokens, ``"in,cached,out"``:
    #: the documents' ``cost_usd`` (null without it) and the cost metric.
    judge_price: Annotated[JudgePrice | None, NoDecode] = None

    # Judge prompts and reuse (docs/judges.md, "Prompt layouts" and "Reuse") ------
    #: The order of the prompts' parts (drcredit.judges.prompts.LAYOUTS): ``shared-first-v1``
    #: puts what many calls share first, for the judge servers' prefix caches;
    #: ``rubric-first-v0`` is the order used before it. Stored with each judgment.
    judge_prompt_layout: Literal["shared-first-v1", "rubric-first-v0"] = "shared-first-v1"
    #: Where an identical judge request is answered from an earlier answer: ``tenant``
    #: (any of the tenant's groups, kept in the database), ``group`` (its own group only)
    #: or ``off`` (twins in a group are still asked once).
    judge_reuse: Literal["tenant", "group", "off"] = "tenant"
    #: Stored answers older than this are neither reused nor kept.
    judge_reuse_max_age_s: float = Field(30 * 86400.0, gt=0)
    #: The most answers the store keeps across tenants; past it the oldest go first.
    judge_reuse_max_entries: int = Field(2_000_000, ge=1)

    #: Named audit judges (JSON object; drcredit.audit.judges): each entry takes the
    #: judge settings without their ``judge_`` prefix. Never taken from a request.
    audit_judges: dict[str, dict[str, Any]] = Field(default_factory=dict)

    # Storage and execution -------------------------------------------------
    data_dir: Path = Path(".drcredit")
    database_url: str | None = None
    #: Connections per process (plus as many overflow); capped by the database threads + 4.
    #: Keep processes x 2 x this under the server's max_connections.
    database_pool_size: int = Field(10, ge=1)
    #: Threads of a process's engine that run database transactions for its units (the
    #: units themselves are coroutines and hold no thread while the judge works).
    database_threads: int = Field(6, ge=1, le=64)
    #: Rollout content a process keeps for the units that come back to it, in MB of its
    #: stored JSON (about 1.4x that in memory). A step whose rollouts a worker reads
    #: exceed it still scores exactly; evicted rollouts are read again (2-3 ms each).
    rollout_cache_mb: int = Field(128, ge=1)
    broker_url: str | None = None
    #: Bring the schema to head at start-up (one process at a time on Postgres). False:
    #: never (a migration job runs ``drcredit db upgrade``); a schema behind the release
    #: then makes the API answer 503 and a worker exit, both saying so.
    auto_migrate: bool | None = None
    #: A delivered but unacknowledged message (its worker died) is delivered again after this.
    broker_visibility_timeout_s: float = Field(600.0, gt=0)
    #: A running unit's lease, renewed by its worker's heartbeat every quarter of it
    #: (whatever the judge is doing), so it only expires when that worker is gone.
    lease_s: float = Field(30.0, gt=0)
    #: How often each worker sweeps for work whose message was lost, and how old
    #: (queued, or with an expired lease) such work must be.
    sweep_interval_s: float = Field(5.0, gt=0)
    sweep_stale_after_s: float = Field(5.0, ge=0)
    #: A worker says which queues it consumes (in Redis) every third of this; one that
    #: has not said so for this long counts as gone (one that stops cleanly says so at
    #: once). Groups waiting on a queue without a consumer show it in their status.
    consumer_ttl_s: float = Field(10.0, gt=0)
    #: How long a process keeps judge answers it could not store (the database away)
    #: and tries again, before giving them up.
    store_patience_s: float = Field(600.0, gt=0)

    # API -------------------------------------------------------------------
    api_keys: str = ""
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    max_wait_s: float = Field(300.0, ge=0)
    #: Size limits of one group (a 422 names the field over one).
    max_rubrics: int = Field(100, ge=1)
    max_rollouts: int = Field(256, ge=2)
    max_turns: int = Field(512, ge=1)
    #: Results of a search, pages of a visit, queries and URLs of a call, trusted evidence.
    max_items: int = Field(100, ge=1)
    max_text_chars: int = Field(1_000_000, ge=1)
    on_judge_failure: Literal["zero", "fail", "exclude"] = "zero"

    # Drift over a run -------------------------------------------------------
    #: A run's step is flagged when the total variation distance of its judge levels from
    #: the run's first three steps is above this (0..1); ``GET /v1/runs/{run}`` takes
    #: ``drift_threshold`` to override it per request, and ``/metrics`` uses it.
    drift_threshold: float = Field(DEFAULT_DRIFT_THRESHOLD, ge=0, le=1, allow_inf_nan=False)
    #: ``/metrics`` exports the drift of runs with a group created within this many seconds.
    drift_metrics_window_s: float = Field(3600.0, gt=0)

    # Tenants: shares of the judge fleet and budgets ---------------------------
    #: Per tenant (the names of DRCREDIT_API_KEYS), JSON: weight, max_share, burst
    #: {weight, seconds}, budget
    #: {tokens_per_day, tokens_per_month, usd_per_day, usd_per_month}, on_budget
    #: (refuse | wait), operator (its key reads every tenant's usage). Tenants not
    #: named: weight 1, no cap, no budget (drcredit.tenancy.policy).
    tenants: Annotated[dict[str, TenantPolicy], NoDecode] = Field(default_factory=dict)
    #: Tests and benchmarks only: budget windows of this many seconds (at most an hour;
    #: a month: 30 of them) instead of UTC calendar days and months.
    budget_window_s: float | None = Field(None, gt=0, le=3600)

    # Operations ------------------------------------------------------------
    #: First-generation threshold of Python's cyclic garbage collector in the API and
    #: worker processes (Python's default is 700; 0 keeps the defaults): above a step's
    #: growth in live objects, so garbage is collected between steps. See
    #: ``drcredit.process.tune_gc`` and ``IdleCollector``.
    gc_threshold: int = Field(400_000, ge=0)
    log_level: str = "INFO"
    log_format: Literal["console", "json"] = "console"
    metrics_port: int | None = None

    @field_validator("judge_model")
    @classmethod
    def _model_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("judge_model must not be blank")
        return value

    @field_validator("judge_prompt_layout", "judge_reuse", mode="before")
    @classmethod
    def _named_choice(cls, value: Any, info: Any) -> Any:
        allowed = get_args(cls.model_fields[info.field_name].annotation)
        if value not in allowed:
            raise ValueError(
                f"DRCREDIT_{info.field_name.upper()}: unknown value {value!r} (allowed: {', '.join(allowed)})"
            )
        return value

    @field_validator("judge_price", mode="before")
    @classmethod
    def _price(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_price(value) if value.strip() else None
        return value

    @field_validator("tenants", mode="before")
    @classmethod
    def _tenants(cls, value: Any) -> Any:
        if isinstance(value, str | None):
            return parse_tenants(value)
        return value

    @model_validator(mode="after")
    def _tenants_known(self) -> Settings:
        known = set(self.tenant_keys().values()) if self.api_keys.strip() else None
        if self.tenants and known is not None:
            parse_tenants({t: p.model_dump() for t, p in self.tenants.items()}, known)
        for tenant, policy in self.tenants.items():
            usd = [b for b in ("usd_per_day", "usd_per_month") if getattr(policy.budget, b) is not None]
            if usd and self.judge_price is None:
                raise ValueError(
                    f"{TENANTS_SETTING}.{tenant}.budget.{usd[0]}: a budget in USD needs DRCREDIT_JUDGE_PRICE"
                    " (USD per million input, cached input and output tokens)"
                )
        return self

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'drcredit.sqlite3').resolve()}"

    def limits(self) -> Limits:
        return Limits(self.max_rubrics, self.max_rollouts, self.max_turns, self.max_items, self.max_text_chars)

    @property
    def distributed(self) -> bool:
        return bool(self.broker_url)

    def tenant_keys(self) -> dict[str, str]:
        """API key -> tenant, from ``tenant:key`` pairs."""
        keys: dict[str, str] = {}
        for pair in self.api_keys.split(","):
            pair = pair.strip()
            if not pair:
                continue
            tenant, sep, key = pair.partition(":")
            if not sep or not tenant.strip() or not key.strip():
                raise ValueError(f"DRCREDIT_API_KEYS: expected tenant:key, got {pair!r}")
            keys[key.strip()] = tenant.strip()
        return keys


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
