"""What judging cost: calls and tokens summed over judgments, and their price in USD.

A judge's bill is its tokens: prompt tokens (those the server served from its prefix
cache usually cheaper) and completion tokens. The sums here are over stored judgments
(docs/api.md, "Judge usage and cost"); the price is the operator's
(``DRCREDIT_JUDGE_PRICE``), so the service never guesses what a model costs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

#: The setting a price comes from, named in every error about one.
PRICE_SETTING = "DRCREDIT_JUDGE_PRICE"
_PRICE_PARTS = ("in", "cached", "out")


@dataclass(frozen=True)
class JudgePrice:
    """USD per million tokens: prompt tokens not cached, cached prompt tokens, completion."""

    input: float
    cached: float
    output: float


def parse_price(text: str) -> JudgePrice:
    """``"in,cached,out"`` (three non-negative numbers) as a price; ValueError naming the
    setting and the offending part otherwise."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 3:
        raise ValueError(
            f"{PRICE_SETTING}: expected three numbers 'in,cached,out' (USD per million prompt, cached prompt"
            f" and completion tokens, e.g. '0.15,0.075,0.6'), got {text!r}"
        )
    values = []
    for name, part in zip(_PRICE_PARTS, parts, strict=True):
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{PRICE_SETTING}: the {name} price must be a non-negative number, got {part!r}")
        values.append(value)
    return JudgePrice(*values)


@dataclass(frozen=True)
class Usage:
    """The judge's work behind some judgments.

    ``calls``: HTTP exchanges with the judge (every attempt: retries, failovers and
    rate-limited ones included); ``judgments``: judgments answered by a call of their
    own (ok or failed; not a reused answer, not a deterministic zero, not a skipped
    snippet call: the paper's judge tasks, retries not counted separately). Tokens as the
    server reported them; ``estimated_prompt_tokens`` is the part of ``prompt_tokens``
    estimated by the platform for calls cut off before any usage came back. ``reused``:
    judgments answered from the tenant's store of earlier answers (no call, no tokens).
    """

    calls: int = 0
    judgments: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    estimated_prompt_tokens: int = 0
    reused: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(Usage)))

    def __sub__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(Usage)))

    def cost_usd(self, price: JudgePrice | None) -> float | None:
        """(uncached prompt x in + cached x cached + completion x out) / 1e6; None without a price."""
        if price is None:
            return None
        cached = min(self.cached_prompt_tokens, self.prompt_tokens)
        return (
            (self.prompt_tokens - cached) * price.input + cached * price.cached + self.completion_tokens * price.output
        ) / 1e6

    @property
    def cached_prompt_share(self) -> float | None:
        """The part of the prompt tokens the judge served from its prefix cache; None without any."""
        if self.prompt_tokens <= 0:
            return None
        return min(self.cached_prompt_tokens, self.prompt_tokens) / self.prompt_tokens

    def document(self, price: JudgePrice | None) -> dict[str, Any]:
        """The ``usage`` object of the documents."""
        return {
            **{f.name: getattr(self, f.name) for f in fields(Usage)},
            "cached_prompt_share": self.cached_prompt_share,
            "cost_usd": self.cost_usd(price),
        }


def total(usages: Iterable[Usage]) -> Usage:
    out = Usage()
    for u in usages:
        out = out + u
    return out


def per_item(usage: Usage, items: int, price: JudgePrice | None) -> dict[str, Any] | None:
    """The ``usage`` object divided by ``items`` (trajectories): means, cost included;
    None for no items."""
    if items <= 0:
        return None
    doc = usage.document(price)
    out = {k: (v / items if v is not None else None) for k, v in doc.items()}
    out["cached_prompt_share"] = doc["cached_prompt_share"]  # a ratio, not a sum
    return out


def mean_of(documents: Iterable[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Field by field mean of per-item usage objects (None entries left out)."""
    present = [d for d in documents if d is not None]
    if not present:
        return None
    out: dict[str, Any] = {}
    for key in present[0]:
        values = [d[key] for d in present if d[key] is not None]
        out[key] = math.fsum(values) / len(values) if values and len(values) == len(present) else None
    return out
