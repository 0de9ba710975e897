"""GET /usage: what the caller's org spent today and this month, against its budgets."""

from __future__ import annotations

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.engine.spend import org_budget

__all__ = ["OrgUsage"]


class OrgUsage:
    """The org's spend (USD, UTC day and month) and budgets; its own org only."""

    def __init__(self, pool: ConnectionPool[DictConnection], settings: Settings) -> None:
        self._pool = pool
        self._budgets = settings.budgets

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers the caller's org's spend against SA_ORG_BUDGET_DAILY / _MONTHLY."""
        org_id = req.context.caller.org_id
        resp.media = {"org_id": org_id, **org_budget(self._pool, org_id, self._budgets)}
