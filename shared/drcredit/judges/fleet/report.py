"""One endpoint as the whole deployment sees it (``/readyz``): the fleet's record of it and
every live process's view of it, added up."""

from __future__ import annotations

from collections import Counter
from typing import Any

from drcredit.judges.fleet.endpoints import EndpointConfig
from drcredit.judges.fleet.store import EndpointRecord


def endpoint_status(
    url: str, record: EndpointRecord, views: list[dict[str, Any]], config: EndpointConfig
) -> dict[str, Any]:
    """``views``: the processes' reports of the endpoint (``Sharing._endpoint_report``)."""
    ups = [bool(v.get("up")) for v in views]
    latencies = [v["latency_s"] for v in views if v.get("latency_s") is not None]
    counts: Counter[str] = Counter()
    for v in views:
        counts.update(v.get("counts") or {})
    down = [v for v in views if not v.get("up")]
    depths = [float(v["prefill_depth"]) for v in views if v.get("prefill_depth") is not None]
    return {
        "endpoint": url,
        # idle: no process has called it yet; mixed: some processes have it out of
        # their rotation, others not.
        "state": "idle" if not views else "up" if all(ups) else "down" if not any(ups) else "mixed",
        "processes": len(views),
        "in_flight": sum(int(v.get("in_flight") or 0) for v in views),
        "limit": round(record.limit.limit, 2),
        "slow_start": record.limit.slow_start,
        # Seen queueing calls inside (latency over its base, or a timeout while it
        # answered others), and the slots that implied.
        "queues": record.limit.queues,
        "slots_estimate": None if record.limit.slots is None else round(record.limit.slots, 1),
        "waiting": sum(int(v.get("waiting") or 0) for v in views),
        # Calls sent and waiting for their prefill (their first streamed event), and how
        # many the processes let wait (null: the endpoint's answers are not streamed).
        "prefilling": sum(int(v.get("prefilling") or 0) for v in views),
        "prefill_depth": round(sum(depths), 2) if depths else None,
        "latency_s": round(sum(latencies) / len(latencies), 4) if latencies else None,
        "answered": counts["answered"],
        "rate_limited": counts["rate_limited"],
        "failed": counts["connection"] + counts["timeout"] + counts["server_error"],
        "requests_per_minute": round(record.rpm, 1) if record.rpm is not None else None,
        "rate_source": None if record.rpm is None else "inferred" if record.rpm_inferred else "declared",
        "tokens_per_minute": record.tpm,
        "context_tokens": record.context_tokens or config.context_tokens,
        "slots": record.slots,
        "reason": down[0].get("reason") if down else None,
    }
