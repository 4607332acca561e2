"""Build the configured judge backend from settings."""

from __future__ import annotations

import hashlib
from importlib import metadata

from drcredit.judges.base import Judge, RetryPolicy
from drcredit.judges.fleet.router import Fleet
from drcredit.settings import Settings
from drcredit.tenancy.shares import Shares


def build_judge(settings: Settings, *, fleet: Fleet | None = None) -> Judge:
    """The judge ``settings`` configure; ``fleet``: endpoints already in use by another
    judge of this process (an audit judge on the main judge's endpoints shares its queue)."""
    retry = RetryPolicy(settings.judge_max_attempts, settings.judge_backoff_initial_s, settings.judge_backoff_max_s)
    if settings.judge == "offline":
        from drcredit.judges.offline import OfflineJudge

        return OfflineJudge(prompt_layout=settings.judge_prompt_layout)
    check_openai_version(metadata.version("openai"))
    from drcredit.judges.fleet.endpoints import parse_endpoints
    from drcredit.judges.fleet.rates import RateLimits
    from drcredit.judges.fleet.store import FleetStore, MemoryStore, RedisStore
    from drcredit.judges.openai_judge import OpenAIJudge

    if not settings.judge_model:
        raise ValueError("DRCREDIT_JUDGE=openai needs DRCREDIT_JUDGE_MODEL (the model name the endpoint serves)")
    endpoints = parse_endpoints(settings.judge_base_url)
    store: FleetStore = MemoryStore()
    if settings.broker_url:
        # Every process of a distributed deployment learns into one record per endpoint.
        scope = hashlib.sha256("|".join(e.url for e in endpoints).encode()).hexdigest()[:16]
        store = RedisStore(settings.broker_url, scope)
    return OpenAIJudge(
        base_url=settings.judge_base_url,
        endpoints=endpoints,
        model=settings.judge_model,
        api_key=settings.judge_api_key,
        timeout_s=settings.judge_timeout_s,
        connect_timeout_s=settings.judge_connect_timeout_s,
        max_tokens=settings.judge_max_tokens,
        temperature=settings.judge_temperature,
        response_format=settings.judge_response_format,
        extra_body=settings.judge_extra_body,
        retry=retry,
        outage_deadline_s=settings.judge_outage_deadline_s,
        keepalive_s=settings.judge_keepalive_s,
        store=store,
        rates=RateLimits(settings.judge_rpm, settings.judge_tpm),
        fleet=fleet,
        prompt_layout=settings.judge_prompt_layout,
        shares=Shares(settings.tenants),
    )


#: The oldest ``openai`` release the judge runs on (its httpx2 transport and aiohttp client).
OPENAI_MINIMUM = (3, 54)


def check_openai_version(installed: str) -> None:
    """The judge needs ``openai`` 3.54 or later; an environment built for a trainer may
    have an older one (the ``prime-rl`` extra pins openai below 3)."""
    parts = tuple(int(p) for p in installed.split(".")[:2] if p.isdigit())
    if parts < OPENAI_MINIMUM:
        raise ValueError(
            f"DRCREDIT_JUDGE=openai needs the openai package {'.'.join(map(str, OPENAI_MINIMUM))} or later;"
            f" this environment has {installed} (the prime-rl extra pins openai below 3): run the service"
            " from an environment without that extra"
        )
