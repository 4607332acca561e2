"""CPU per judge call of the ``openai`` judge backend, client side only.

The simulated judge runs in its own process with no latency, so this process's CPU time
is the backend's: building the prompt, the HTTP exchange, parsing and validating the
answer. Repeated runs print the median and the worst.

    python -m bench.judge_client [--calls 3000] [--concurrency 64] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time

import httpx

from bench.workload import make_group
from drcredit.domain.group import GroupIn, VisitTurn
from drcredit.judges.base import RetryPolicy, VisitJudgeRequest
from drcredit.judges.openai_judge import OpenAIJudge


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _requests() -> list[VisitJudgeRequest]:
    group = GroupIn.model_validate(make_group(1, "cpu"))
    out: list[VisitJudgeRequest] = []
    for rollout in group.rollouts:
        for turn in rollout.turns:
            if isinstance(turn, VisitTurn) and turn.usable_pages:
                out.extend(VisitJudgeRequest(group.question, r, (), turn) for r in group.positive_rubrics)
    return out


async def _run(judge: OpenAIJudge, requests: list[VisitJudgeRequest], calls: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            result = await judge.ajudge_visit(requests[i % len(requests)])
            assert result.status == "ok", result.failure_reason

    started = time.process_time()
    await asyncio.gather(*(one(i) for i in range(calls)))
    elapsed = time.process_time() - started
    await judge.aclose()
    return elapsed / calls * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    port = _free_port()
    sim = subprocess.Popen(
        [sys.executable, "-m", "bench.judge_sim", "--port", str(port), "--latency", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/stats", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        requests = _requests()
        figures = []
        for _ in range(args.repeat + 1):  # the first run warms up and is not counted
            judge = OpenAIJudge(base_url=f"http://127.0.0.1:{port}/v1", model="sim", retry=RetryPolicy(max_attempts=1))
            figures.append(asyncio.run(_run(judge, requests, args.calls, args.concurrency)))
        counted = figures[1:]
        print(
            json.dumps(
                {
                    "cpu_ms_per_call_median": round(statistics.median(counted), 3),
                    "cpu_ms_per_call_worst": round(max(counted), 3),
                    "runs": [round(x, 3) for x in counted],
                    "calls": args.calls,
                    "concurrency": args.concurrency,
                }
            )
        )
    finally:
        sim.terminate()
        sim.wait(10)


if __name__ == "__main__":
    main()
