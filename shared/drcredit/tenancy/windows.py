"""Budget windows and the check of a tenant's usage against its budgets.

Windows are UTC calendar days and months: a budget ``*_per_day`` counts what was used
since the day's 00:00 UTC and resets at the next; ``*_per_month`` since the 1st. For
tests and benchmarks ``window_s`` replaces them by windows of that many seconds from
the epoch (a "month" then lasts 30 of them). Tokens are prompt plus completion tokens;
USD is their cost at the operator's price.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from drcredit.domain.usage import JudgePrice, Usage
from drcredit.tenancy.policy import BUDGETS, BudgetName, TenantPolicy

Window = Literal["day", "month"]
WINDOWS: tuple[Window, ...] = ("day", "month")

#: Test windows: a "month" is this many "days".
TEST_MONTH_DAYS = 30


def window_of(budget: BudgetName) -> Window:
    return "day" if budget.endswith("_day") else "month"


def bounds(window: Window, now: datetime, window_s: float | None = None) -> tuple[datetime, datetime]:
    """Start (inclusive) and end (the reset) of the window holding ``now`` (aware, UTC)."""
    now = now.astimezone(UTC)
    if window_s:
        length = window_s * (TEST_MONTH_DAYS if window == "month" else 1)
        start_s = (now.timestamp() // length) * length
        return datetime.fromtimestamp(start_s, UTC), datetime.fromtimestamp(start_s + length, UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if window == "day":
        return day, day + timedelta(days=1)
    month = day.replace(day=1)
    following = (
        month.replace(year=month.year + 1, month=1) if month.month == 12 else month.replace(month=month.month + 1)
    )
    return month, following


#: The ledger's bucket of time (:class:`drcredit.storage.models.TenantUsage`): an hour,
#: or a test window when shorter.
BUCKET_S = 3600.0


def held_for_budget(status: str, held_until: datetime | None) -> bool:
    """A group, batch member or audit stored ``queued`` with a hold until its tenant's
    budget resets: shown ``waiting_for_budget``, and nothing of it is sent before then."""
    return status == "queued" and held_until is not None


def bucket(at: datetime, window_s: float | None = None) -> datetime:
    """The start of the ledger bucket holding ``at``."""
    length = min(BUCKET_S, window_s) if window_s else BUCKET_S
    return datetime.fromtimestamp((at.timestamp() // length) * length, UTC)


def spent(budget: BudgetName, usage: Usage, price: JudgePrice | None) -> float:
    """What ``usage`` counts against ``budget``: tokens, or USD at ``price`` (0 without one)."""
    if budget.startswith("tokens"):
        return float(usage.prompt_tokens + usage.completion_tokens)
    return usage.cost_usd(price) or 0.0


@dataclass(frozen=True)
class BudgetState:
    """One budget in its current window."""

    budget: BudgetName
    limit: float
    used: float
    resets_at: datetime

    @property
    def left(self) -> float:
        return max(0.0, self.limit - self.used)

    @property
    def exhausted(self) -> bool:
        return self.used >= self.limit


def states(
    policy: TenantPolicy,
    usage: Mapping[Window, Usage],
    price: JudgePrice | None,
    now: datetime,
    window_s: float | None = None,
) -> list[BudgetState]:
    """Each budget the tenant has, with its use in the current window (``usage`` per window)."""
    limits = policy.budget.limits()
    out = []
    for name in BUDGETS:
        if name in limits:
            window = window_of(name)
            out.append(
                BudgetState(name, limits[name], spent(name, usage[window], price), bounds(window, now, window_s)[1])
            )
    return out


def blocking(budgets: list[BudgetState]) -> BudgetState | None:
    """The exhausted budget work must wait for: the one that resets last (None: none is)."""
    spent_ = [b for b in budgets if b.exhausted]
    return max(spent_, key=lambda b: (b.resets_at, BUDGETS.index(b.budget))) if spent_ else None
