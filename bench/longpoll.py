"""How soon a finished group reaches a client that long-polls it (issue 15, item 3).

    python -m bench.run --sections longpoll [--longpoll-groups 200]

Small groups are posted one after another against a fast simulated judge while a client
thread per group long-polls ``/v1/groups/{id}/advantages?wait=60``. For every group the
latency is the client's receipt time minus ``groups.finished_at``, which aggregation
stamps before it stores the results and commits: an upper bound on commit-to-answer.
Measured in distributed mode (API + a plain worker, Postgres, Redis: the answer travels
by ``NOTIFY``) and in embedded mode (one process, SQLite).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import redis

from bench.paths import percentile
from bench.platform import Stack, bench_redis, fresh_database, plain_env, start_judge, start_plain
from bench.workload import make_group


def _finished_at(database_url: str, group_ids: list[str]) -> dict[str, float]:
    query = "SELECT group_id, finished_at FROM groups WHERE group_id = ANY(%s)"
    if database_url.startswith("sqlite"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
            rows = conn.execute(
                f"SELECT group_id, finished_at FROM groups WHERE group_id IN ({','.join('?' * len(group_ids))})",
                group_ids,
            ).fetchall()
        from datetime import UTC, datetime

        return {g: datetime.fromisoformat(f).replace(tzinfo=UTC).timestamp() for g, f in rows}
    with psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        return {g: f.timestamp() for g, f in conn.execute(query, (group_ids,)).fetchall()}


def _measure(api: str, database_url: str, n: int, spacing_s: float) -> dict[str, Any]:
    """One asyncio client (no thread per waiter, whose scheduling would add its own delay).

    The client is aiohttp's: with 200 long-polls open on one ``httpx.AsyncClient``, httpx
    itself took a median ~100 ms (up to ~370 ms) from the API's answer being sent (its
    access log) to the answer in hand, more than the platform's whole path; aiohttp
    took 0.5 ms (2 ms p90) in the same runs (BENCHMARKS.md, seventh round).
    """
    tag = uuid.uuid4().hex[:6]
    docs = [make_group(7000 + i, f"lp-{tag}-{i}", rollouts=2) for i in range(n)]
    received: dict[str, float] = {}

    async def run() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as client:

            async def wait_for(group_id: str) -> None:
                while True:
                    async with client.get(f"{api}/v1/groups/{group_id}/advantages", params={"wait": 60}) as r:
                        await r.read()
                        if r.status == 200:
                            received[group_id] = time.time()
                            return

            waiters = []
            for doc in docs:
                async with client.post(f"{api}/v1/groups", json=doc) as r:
                    r.raise_for_status()
                waiters.append(asyncio.create_task(wait_for(doc["group_id"])))
                await asyncio.sleep(spacing_s)
            await asyncio.gather(*waiters)

    asyncio.run(run())
    finished = _finished_at(database_url, [d["group_id"] for d in docs])
    latencies = [1000 * (received[g] - finished[g]) for g in finished]
    return {
        "groups": len(latencies),
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": max(latencies),
    }


def section_longpoll(args: argparse.Namespace, results: dict[str, Any]) -> None:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp))
        try:
            judge = start_judge(stack, args.longpoll_latency, 0.5)
            redis.Redis.from_url(bench_redis()).flushdb()
            with fresh_database() as db:
                api, procs = start_plain(stack, plain_env(judge, db, bench_redis()), workers=1)
                out["distributed"] = _measure(api, db, args.longpoll_groups, 0.02)
                for proc in procs:
                    proc.stop()
            sqlite_url = f"sqlite:///{Path(tmp) / 'lp.sqlite3'}"
            api, _ = start_plain(stack, plain_env(judge, sqlite_url, None), workers=0)
            out["embedded"] = _measure(api, sqlite_url, args.longpoll_groups, 0.02)
        finally:
            stack.stop()
    results["longpoll"] = out


def table(lp: dict[str, Any]) -> str:
    lines = ["long-poll: commit of a group's results to the client's answer"]
    for mode, m in lp.items():
        lines.append(
            f"  {mode:<12} {m['groups']} groups: p50 {m['p50_ms']:.1f} ms, p99 {m['p99_ms']:.1f} ms, max {m['max_ms']:.1f} ms"
        )
    return "\n".join(lines)
