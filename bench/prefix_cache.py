"""A judge replica's prefix cache and prefill cost, for the simulated judge (:mod:`bench.judge_sim`).

Modelled on automatic prefix caching as vLLM does it: the prompt (the chat messages in
order, as a chat template would lay them out) is cut into fixed blocks; each full block
is keyed by a hash chained on the previous block's key, so a block is found only when
everything before it is the same. A request reuses the longest run of leading blocks
already in the cache; the rest is prefilled and its full blocks enter the cache, which
evicts its least recently used blocks past its capacity. Blocks are ``block_chars``
characters (256 by default), and tokens are characters // 4, as the simulator counts them.

Prefill costs ``prefill_s_per_token`` seconds per uncached token, and one replica
prefills one request at a time (its compute is shared: concurrent prefills queue), so an
uncached page sent eight times costs eight times the time, and a cached one nearly none.
A request looks the cache up when its prefill starts, so a prefix counts as cached only
after some request has prefilled it.

    python -m bench.judge_sim --prefix-cache-blocks 32768 --prefill-us-per-token 20
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import time
from collections import OrderedDict
from typing import Any

CHARS_PER_TOKEN = 4


def prompt_text(messages: list[dict[str, Any]]) -> str:
    """The messages as a chat template would lay them out, role marks included."""
    return "".join(f"<|{m.get('role', '')}|>{m.get('content') or ''}<|end|>" for m in messages)


class PrefixCache:
    """One replica's cache of prompt blocks (LRU, bounded) and its prefill lane."""

    def __init__(self, capacity_blocks: int, block_chars: int = 256, prefill_s_per_token: float = 0.0):
        self.capacity = capacity_blocks
        self.block_chars = block_chars
        self.prefill_s_per_token = prefill_s_per_token
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        #: Every block key this replica ever prefilled: what it had to prefill at least once.
        self._seen: set[bytes] = set()
        #: ``required_prefilled_tokens``: those distinct blocks and every request's tail
        #: past its last full block (never cached: a call's own rubric and history end it).
        self._lane = asyncio.Lock()
        #: When the lane's last prefill ends, on the event loop's clock.
        self._free_at = 0.0
        #: Each prefill's (start, end), wall-clock seconds, since the reset.
        self.intervals: list[tuple[float, float]] = []
        self.stats: dict[str, float] = {
            "cached_prompt_tokens": 0,
            "prefilled_tokens": 0,
            "distinct_prefilled_tokens": 0,
            "required_prefilled_tokens": 0,
            "evicted_blocks": 0,
            # The lane's timeline (wall-clock seconds; 0: nothing prefilled since the reset),
            # for telling a step bound by the lanes from one that left them idle.
            "lane_started_at": 0,
            "lane_ended_at": 0,
            "lane_busy_s": 0,
            "lane_wait_s": 0,
            "lane_max_wait_s": 0,
            "lane_prefills": 0,
        }

    def admit(self, text: str) -> int:
        """Look ``text`` up and cache its full blocks; the cached characters at its start."""
        key = b""
        cached_blocks = 0
        hit = True
        full = len(text) // self.block_chars
        for i in range(full):
            block = text[i * self.block_chars : (i + 1) * self.block_chars]
            key = hashlib.blake2b(key + block.encode(), digest_size=16).digest()
            if hit and key in self._blocks:
                self._blocks.move_to_end(key)
                cached_blocks += 1
                continue
            hit = False
            self._blocks[key] = None
            if key not in self._seen:
                self._seen.add(key)
                self.stats["distinct_prefilled_tokens"] += self.block_chars // CHARS_PER_TOKEN
                self.stats["required_prefilled_tokens"] += self.block_chars // CHARS_PER_TOKEN
        self.stats["required_prefilled_tokens"] += (len(text) - full * self.block_chars) // CHARS_PER_TOKEN
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
            self.stats["evicted_blocks"] += 1
        return cached_blocks * self.block_chars

    async def prefill(self, messages: list[dict[str, Any]], prompt_tokens: int) -> int:
        """Serve a request's prompt: its cached tokens, after the prefill of the rest.

        The cache is looked up when the request's turn in the prefill lane comes, not when
        it arrives: a prefix is there for others only once it has been prefilled. Two calls
        sharing a page that arrive together thus pay it once only because the second waits
        for the first's prefill, as a scheduler that prefills one request at a time and
        then finds the blocks would (SGLang's radix cache); a server that prefills both in
        one batch (vLLM) computes the shared blocks twice, which this does not model."""
        text = prompt_text(messages)
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        async with self._lane:
            cached = min(prompt_tokens, self.admit(text) // CHARS_PER_TOKEN)
            uncached = prompt_tokens - cached
            self.stats["cached_prompt_tokens"] += cached
            self.stats["prefilled_tokens"] += uncached
            if self.prefill_s_per_token > 0 and uncached > 0:
                # On the lane's own clock: this prefill starts when the previous one ended
                # (or when it arrived, if the lane was idle), not when this process got
                # round to it. Each sleep overshoots by the event loop's lag, and summed over
                # a step's thousand prefills that made the lane 5% slower than its stated cost.
                start = max(arrived, self._free_at)
                self._free_at = start + uncached * self.prefill_s_per_token
                self._record(start - arrived, start, self._free_at, loop.time())
                await asyncio.sleep(max(0.0, self._free_at - loop.time()))
        return cached

    def _record(self, waited: float, start: float, end: float, now: float) -> None:
        """One prefill's place on the lane's timeline (``start`` and ``end`` on the loop's
        clock, ``now`` its time now: the stats are kept in wall-clock seconds)."""
        wall = time.time() - now
        stats = self.stats
        if not stats["lane_started_at"]:
            stats["lane_started_at"] = wall + start
        stats["lane_ended_at"] = wall + end
        stats["lane_busy_s"] += end - start
        stats["lane_wait_s"] += waited
        stats["lane_max_wait_s"] = max(stats["lane_max_wait_s"], waited)
        stats["lane_prefills"] += 1
        self.intervals.append((wall + start, wall + end))

    def reset(self) -> None:
        """Zero the counters (the cache itself stays warm, as a server's does between steps)."""
        for key in self.stats:
            self.stats[key] = 0
        self.intervals = []


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prefix-cache-blocks", type=int, default=0, help="blocks of a prefix cache (0: no cache, no prefill cost)"
    )
    parser.add_argument("--prefix-block-chars", type=int, default=256)
    parser.add_argument("--prefill-us-per-token", type=float, default=0.0, help="prefill time per uncached token")


def from_args(args: argparse.Namespace) -> PrefixCache | None:
    if args.prefix_cache_blocks <= 0:
        return None
    return PrefixCache(args.prefix_cache_blocks, args.prefix_block_chars, args.prefill_us_per_token / 1e6)
