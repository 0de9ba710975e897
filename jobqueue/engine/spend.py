"""Per-org budgets against what the org spent: the submit's check, the org's view, the workers' hold.

The spend is summed per UTC day by the finalize (sa_org_spend); the judgement is pure
(jobqueue/core/budget.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg_pool import ConnectionPool

from jobqueue.core.budget import Budgets, exceeded, next_day, next_month
from jobqueue.core.db import DictConnection
from jobqueue.core.errors import OverBudget
from jobqueue.core.queries import spend as q

__all__ = ["HeldOrgs", "check_budget", "org_budget", "over_budget"]


def _spent_on(conn: DictConnection, org_id: int, now: datetime | None) -> tuple[float, float]:
    row = conn.execute(q.ORG_SPEND_GET, {"org_id": org_id, "now": now}).fetchone()
    assert row is not None
    return float(row["day_cost"]), float(row["month_cost"])


def _spent(pool: ConnectionPool[DictConnection], org_id: int,
           now: datetime | None) -> tuple[float, float]:
    with pool.connection() as conn:
        return _spent_on(conn, org_id, now)


def over_budget(conn: DictConnection, org_id: int, budgets: Budgets) -> bool:
    """Whether the org has spent a budget (its queued work waits); no read when none is set."""
    if not budgets:
        return False
    day_cost, month_cost = _spent_on(conn, org_id, None)
    return exceeded(budgets, day_cost, month_cost, datetime.now(UTC)) is not None


def check_budget(pool: ConnectionPool[DictConnection], org_id: int, budgets: Budgets,
                 now: datetime | None = None) -> None:
    """Refuses new work of an org past its budget; no read at all when no budget is set.

    PERF: one read of sa_org_spend_pkey (ORG_SPEND_GET), no cache: it is exact the moment a
    call's cost is committed, and costs one short indexed round trip per submit.

    Raises:
        OverBudget: the org has spent its daily or monthly budget (429 with Retry-After).
    """
    if not budgets:
        return
    day_cost, month_cost = _spent(pool, org_id, now)
    at = now or datetime.now(UTC)
    over = exceeded(budgets, day_cost, month_cost, at)
    if over is not None:
        raise OverBudget(over.description, over.seconds_left(at))


def org_budget(pool: ConnectionPool[DictConnection], org_id: int, budgets: Budgets,
               now: datetime | None = None) -> dict[str, Any]:
    """What the org spent today and this month (USD, UTC), against its budgets and their resets."""
    day_cost, month_cost = _spent(pool, org_id, now)
    at = now or datetime.now(UTC)
    over = exceeded(budgets, day_cost, month_cost, at)

    def one(spent: float, budget: float, resets: datetime) -> dict[str, Any]:
        return {"spent": round(spent, 9), "budget": budget or None,
                "resets_at": resets.isoformat().replace("+00:00", "Z")}

    return {"daily": one(day_cost, budgets.daily, next_day(at)),
            "monthly": one(month_cost, budgets.monthly, next_month(at)),
            "exceeded": None if over is None else over.setting}


@dataclass
class HeldOrgs:
    """The orgs past their budget, for a worker's claims: read at most every `ttl` seconds.

    PERF: one grouped read of this month's sa_org_spend rows (ORG_SPEND_LIST_OVER_BUDGET) per
    `ttl`, not per claim; none when no budget is set. An org may so run up to `ttl` seconds of
    claims past its budget (the calls already started are paid in any case).
    """

    pool: ConnectionPool[DictConnection]
    budgets: Budgets
    ttl: float = 1.0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._orgs: list[int] = []
        self._read_at = -float("inf")

    def current(self) -> list[int]:
        """The orgs whose queued jobs wait (empty when no budget is set)."""
        if not self.budgets:
            return []
        now = time.monotonic()
        with self._lock:
            if now - self._read_at < self.ttl:
                return self._orgs
        with self.pool.connection() as conn:
            rows = conn.execute(q.ORG_SPEND_LIST_OVER_BUDGET, {
                "now": None, "daily": self.budgets.daily,
                "monthly": self.budgets.monthly}).fetchall()
        with self._lock:
            self._orgs, self._read_at = [r["org_id"] for r in rows], now
            return self._orgs
