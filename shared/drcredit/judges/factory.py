"""Build the configured judge backend from settings."""

from __future__ import annotations

from drcredit.judges.base import Judge, RetryPolicy
from drcredit.settings import Settings


def build_judge(settings: Settings) -> Judge:
    retry = RetryPolicy(settings.judge_max_attempts, settings.judge_backoff_initial_s, settings.judge_backoff_max_s)
    if settings.judge == "offline":
        from drcredit.judges.offline import OfflineJudge

        return OfflineJudge()
    from drcredit.judges.openai_judge import OpenAIJudge

    if not settings.judge_model:
        raise ValueError("DRCREDIT_JUDGE=openai needs DRCREDIT_JUDGE_MODEL (the model name the endpoint serves)")
    return OpenAIJudge(
        base_url=settings.judge_base_url,
        model=settings.judge_model,
        api_key=settings.judge_api_key,
        timeout_s=settings.judge_timeout_s,
        max_tokens=settings.judge_max_tokens,
        temperature=settings.judge_temperature,
        response_format=settings.judge_response_format,
        extra_body=settings.judge_extra_body,
        retry=retry,
        outage_deadline_s=settings.judge_outage_deadline_s,
        keepalive_s=settings.judge_keepalive_s,
    )
