"""What the order in a judge server's prefill lane does to a step, in a model (issue 43).

    python -m bench.lane_model --seeds 0,1,2 [--prefill-caps 2,4,8,16,32 --prefill-ms 50,100]

The two-replica prefix step (``bench.prefix_reuse``) reads 1.12-1.27x its bound. This
model asks whether any platform could do better against the same servers. It runs the
step's visit chains on ``--replicas`` prefill lanes in simulated time, nothing else:
each call is its prefill (the visit's pages for a visit's first call on that replica,
then only its tail) in its replica's lane, then one judge latency; a rubric's call for a
visit goes out when its call for the previous visit is answered; a visit is pinned to the
replica with the least work queued when its first call goes out, as the fleet pins it.
Snippet and report calls, the platform's own time and the start-up are left out, so the
figures are what the lanes' order alone costs. The lane is served

- ``fcfs``: first come first served, as vLLM, SGLang and llama.cpp serve by default;
- ``priority``: the call whose chain has the most calls left first, as a server with
  priority scheduling would serve what the platform sends it;
- ``cap N``: first come first served, but the platform holds each replica to N calls in
  flight and sends the held ones most-calls-left first (its own queue's order);
- ``prefill N``: the same, holding each replica to N calls sent and not yet prefilled
  (a call in its latency no longer counts: what a streamed answer's first event tells
  the platform, :mod:`drcredit.judges.fleet.prefill`); ``prefill-ms T``: to T ms of
  expected prefill not yet done.

Each reads its wall against the bound ``bench.prefix_reuse`` uses: the longer of the
longest chain x the latency and the busiest lane's prefill plus one latency.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.prefix_cache import CHARS_PER_TOKEN
from bench.workload import make_step
from drcredit.domain.credit import plan_rollout
from drcredit.domain.group import GroupIn, VisitTurn


@dataclass(frozen=True)
class Chain:
    """One rollout's visits in chain order: each visit's page tokens, and its rubric calls."""

    pages: tuple[int, ...]
    rubrics: int
    #: The worker process that runs it (its group's delivery).
    process: int = 0


@dataclass
class Lanes:
    """The replicas' prefill lanes and what the platform holds back, in simulated time."""

    chains: Sequence[Chain]
    replicas: int
    policy: str
    cap: int | None
    prefill_s_per_token: float
    tail_tokens: int
    latency_s: float
    processes: int = 1
    _events: list[tuple[float, int, str, tuple[int, ...]]] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        n = self.replicas
        #: Per replica: its lane's queue, whether it prefills, its calls in flight, the
        #: prefill the platform expects queued there, and the prefill it did.
        self.queue: list[list[tuple[int, int, int, int, int, float]]] = [[] for _ in range(n)]
        self.busy, self.flight = [False] * n, [0] * n
        #: Per process and replica: the calls sent and not yet prefilled, and their
        #: expected prefill (each process holds its own calls to the cap).
        self.waiting = [[0] * n for _ in range(self.processes)]
        self.waiting_s = [[0.0] * n for _ in range(self.processes)]
        self.queued_s, self.work_s = [0.0] * n, [0.0] * n
        #: Calls each process holds back (a cap), most calls left first.
        self.held: list[list[tuple[int, int, int, int, int]]] = [[] for _ in range(self.processes)]
        #: Each visit's replica, and the (replica, chain, visit) pages prefilled.
        self.pinned: dict[tuple[int, int], int] = {}
        self.prefilled: set[tuple[int, int, int]] = set()

    def run(self) -> tuple[float, float]:
        """(wall, bound) of the step, in seconds (once per instance)."""
        for c, chain in enumerate(self.chains):
            for r in range(chain.rubrics if chain.pages else 0):
                self._at(0.0, "ready", (c, 0, r))
        end = 0.0
        while self._events:
            now, _, kind, what = heapq.heappop(self._events)
            if kind == "ready":
                self._ready(now, *what)
            elif kind == "lane":
                self.busy[what[0]] = False
                self.waiting[what[2]][what[0]] -= 1
                self.waiting_s[what[2]][what[0]] -= what[1] / 1e6
                self._serve(now, what[0])
                self._release(now)
            else:
                end = now
                replica, c, k, r = what
                self.flight[replica] -= 1
                if k + 1 < len(self.chains[c].pages):
                    self._ready(now, c, k + 1, r)
                self._release(now)
        longest = max((len(chain.pages) for chain in self.chains), default=0)
        bound = max(longest * self.latency_s, max(self.work_s) + self.latency_s)
        return end, bound

    def _at(self, when: float, kind: str, what: tuple[int, ...]) -> None:
        heapq.heappush(self._events, (when, next(self._order), kind, what))

    def _load(self, process: int) -> list[float]:
        """What the cap counts per replica: calls in flight (``cap``), or the process's
        calls waiting for their prefill (``prefill``), or milliseconds of their expected
        prefill (``prefill-ms``)."""
        if self.policy == "prefill":
            return [float(x) for x in self.waiting[process]]
        if self.policy == "prefill-ms":
            return [x * 1000 for x in self.waiting_s[process]]
        return [float(x) for x in self.flight]

    def _process(self, c: int) -> int:
        """The worker process that runs chain ``c`` (one process: all of them)."""
        return self.chains[c].process % self.processes

    def _calls_left(self, c: int, k: int) -> int:
        return len(self.chains[c].pages) - k

    def _cost(self, c: int, k: int, with_pages: bool) -> float:
        pages = self.chains[c].pages[k] if with_pages else 0
        return (pages + self.tail_tokens) * self.prefill_s_per_token

    def _ready(self, now: float, c: int, k: int, r: int) -> None:
        process = self._process(c)
        heapq.heappush(self.held[process], (-self._calls_left(c, k), next(self._order), c, k, r))
        self._release(now)

    def _release(self, now: float) -> None:
        for process in range(self.processes):
            self._release_of(now, process)

    def _release_of(self, now: float, process: int) -> None:
        """Send the process's held calls the cap lets through, most calls left first."""
        kept = []
        held = self.held[process]
        while held and (self.cap is None or min(self._load(process)) < self.cap):
            call = heapq.heappop(held)
            _, _, c, k, _ = call
            replica = self.pinned.get((c, k))
            if replica is None:
                replica = min(range(self.replicas), key=lambda x: (self.queued_s[x], self.flight[x]))
            if self.cap is not None and self._load(process)[replica] >= self.cap:
                kept.append(call)
                continue
            # What the platform expects it to cost: the pages only if no call of the
            # visit went there before (that one prefills them).
            expected = self._cost(c, k, with_pages=(c, k) not in self.pinned)
            self.pinned[(c, k)] = replica
            self.flight[replica] += 1
            self.waiting[process][replica] += 1
            self.waiting_s[process][replica] += expected
            self.queued_s[replica] += expected
            rank = call[0] if self.policy == "priority" else 0
            heapq.heappush(self.queue[replica], (rank, next(self._order), *call[2:], expected))
            self._serve(now, replica)
        for call in kept:
            heapq.heappush(held, call)

    def _serve(self, now: float, replica: int) -> None:
        if self.busy[replica] or not self.queue[replica]:
            return
        _, _, c, k, r, expected = heapq.heappop(self.queue[replica])
        cost = self._cost(c, k, with_pages=(replica, c, k) not in self.prefilled)
        self.prefilled.add((replica, c, k))
        self.queued_s[replica] -= expected
        self.work_s[replica] += cost
        self.busy[replica] = True
        self._at(now + cost, "lane", (replica, round(expected * 1e6), self._process(c)))
        self._at(now + cost + self.latency_s, "answer", (replica, c, k, r))


def chains_of(groups: list[dict[str, Any]], processes: int = 1) -> list[Chain]:
    """Each rollout's judged visits (their usable pages' tokens) and positive rubrics,
    each group's on one of ``processes`` worker processes in turn."""
    out = []
    for g, doc in enumerate(groups):
        group = GroupIn.model_validate(doc)
        for rollout in group.rollouts:
            plan = plan_rollout(group, rollout, group.params)
            turns = plan.chains[0].turn_indices if plan.chains else ()
            pages = []
            for t in turns:
                turn = rollout.turns[t]
                assert isinstance(turn, VisitTurn)
                pages.append(sum(len(p.evidence or "") for p in turn.usable_pages) // CHARS_PER_TOKEN)
            out.append(Chain(tuple(pages), len(group.positive_rubrics), g % processes))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--page-tokens", type=int, default=1500)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--prefill-us-per-token", type=float, default=20.0)
    parser.add_argument("--tail-tokens", type=int, default=100, help="a call's own rubric and history")
    parser.add_argument("--caps", default="64,130,200", help="the cap policies to model")
    parser.add_argument("--prefill-caps", default="", help="calls waiting for their prefill, per replica")
    parser.add_argument("--prefill-ms", default="", help="milliseconds of expected prefill waiting, per replica")
    parser.add_argument("--processes", type=int, default=1, help="worker processes, each with its own queue and cap")
    args = parser.parse_args()
    policies: list[tuple[str, int | None]] = [("fcfs", None), ("priority", None)]
    policies += [("cap", int(x)) for x in args.caps.split(",") if x.strip()]
    policies += [("prefill", int(x)) for x in args.prefill_caps.split(",") if x.strip()]
    policies += [("prefill-ms", int(x)) for x in args.prefill_ms.split(",") if x.strip()]
    for seed in [int(x) for x in args.seeds.split(",")]:
        chains = chains_of(make_step(args.groups, args.rollouts, seed, args.page_tokens), args.processes)
        for policy, cap in policies:
            lanes = Lanes(
                chains,
                args.replicas,
                policy,
                cap,
                args.prefill_us_per_token / 1e6,
                args.tail_tokens,
                args.latency,
                args.processes,
            )
            wall, bound = lanes.run()
            name = policy if cap is None else f"{policy} {cap}"
            print(f"seed {seed} {name:>9}: wall {wall:6.2f} s, bound {bound:6.2f} s, ratio {wall / bound:.3f}")


if __name__ == "__main__":
    main()
