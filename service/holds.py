"""Why an org's due, queued prompts do not start: its running cap, or its spent budget.

The feeds' items say it (`held`), so a page can tell a viewer why a prompt waits although it is
due. The judgement is the one the workers' claims make (SA_ORG_MAX_RUNNING, the budgets).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from jobqueue.core.budget import Budgets
from jobqueue.core.db import DictConnection
from jobqueue.core.queries import mission as mission_q
from jobqueue.engine.spend import over_budget

__all__ = ["Holds"]


@dataclass(frozen=True)
class Holds:
    """An org's limits that hold its due jobs back: `max_running` (0: none) and its budgets."""

    max_running: int
    budgets: Budgets

    def mark(self, conn: DictConnection, org_id: int, items: list[dict[str, Any]]) -> None:
        """Sets each item's `held` (`budget`, `running_cap`, or None).

        PERF: reads only when an item is queued, due and waits for no other job: one read of
        the org's spend, one of its running jobs (at most `max_running` rows).
        """
        now = datetime.now(UTC)
        due = [i for i in items if i["state"] == "queued" and not i["waiting"]
               and i["scheduled_for"] <= now]
        for item in items:
            item["held"] = None
        if not due:
            return
        why = self._why(conn, org_id)
        for item in due:
            item["held"] = why

    def _why(self, conn: DictConnection, org_id: int) -> str | None:
        if over_budget(conn, org_id, self.budgets):
            return "budget"
        if self.max_running > 0:
            row = conn.execute(mission_q.MISSION_ORG_AT_RUNNING_CAP,
                               {"org_id": org_id, "cap": self.max_running}).fetchone()
            if row is not None and row["at_cap"]:
                return "running_cap"
        return None
