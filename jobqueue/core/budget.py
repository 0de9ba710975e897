"""Per-org budgets (SA_ORG_BUDGET_DAILY / _MONTHLY, USD): whether an org's spend is past one,
and when it frees. Pure: the spend is read elsewhere (jobqueue/engine/spend.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

__all__ = ["Budgets", "Exceeded", "exceeded", "next_day", "next_month"]


@dataclass(frozen=True)
class Budgets:
    """USD an org may spend per UTC day and per UTC calendar month (0: no budget)."""

    daily: float = 0.0
    monthly: float = 0.0

    def __post_init__(self) -> None:
        if not all(math.isfinite(b) and b >= 0 for b in (self.daily, self.monthly)):
            raise ValueError("budgets must be finite numbers >= 0 (0: none)")

    def __bool__(self) -> bool:
        return self.daily > 0 or self.monthly > 0


@dataclass(frozen=True)
class Exceeded:
    """The budget an org has spent: which setting, what was spent, and when it frees."""

    setting: str
    spent: float
    budget: float
    resets_at: datetime

    def seconds_left(self, now: datetime) -> int:
        """Whole seconds until the budget frees (at least 1)."""
        return max(1, math.ceil((self.resets_at - now).total_seconds()))

    @property
    def description(self) -> str:
        """What the org is told: spent against the budget, the setting, and when it frees."""
        return (f"the org has spent USD {self.spent:.6f} of its budget of USD {self.budget:.6f} "
                f"({self.setting}); new work is refused and queued work waits until "
                f"{self.resets_at.isoformat().replace('+00:00', 'Z')}")


def next_day(now: datetime) -> datetime:
    """The next UTC midnight after `now`."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day + timedelta(days=1)


def next_month(now: datetime) -> datetime:
    """The first instant of the next UTC calendar month after `now`."""
    now = now.astimezone(UTC)
    year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)


def exceeded(budgets: Budgets, day_cost: float, month_cost: float,
             now: datetime) -> Exceeded | None:
    """The budget the org has spent (the monthly one first: it frees later), or None.

    An org is past a budget once its spend reaches it: the call that crossed it is paid, the
    next one is not started.
    """
    if budgets.monthly > 0 and month_cost >= budgets.monthly:
        return Exceeded("SA_ORG_BUDGET_MONTHLY", month_cost, budgets.monthly, next_month(now))
    if budgets.daily > 0 and day_cost >= budgets.daily:
        return Exceeded("SA_ORG_BUDGET_DAILY", day_cost, budgets.daily, next_day(now))
    return None
