"""The operator console's reads (jobs explorer, bulk counts, the operators' log, routes, workers)
and its route actions (pause, resume), across orgs.

Bulk changes are jobqueue/engine/bulk.py's; one job's history is inspection.job_details.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg_pool import ConnectionPool

from jobqueue.core.console import JobFilter
from jobqueue.core.db import DictConnection
from jobqueue.core.errors import NotFound
from jobqueue.core.queries import console as q
from jobqueue.core.queries import ops_action as audit_q
from jobqueue.core.queries import route as route_q
from jobqueue.core.queries import worker as worker_q
from jobqueue.core.routes import Routes
from jobqueue.core.tokens import Caller
from jobqueue.engine import presence
from jobqueue.engine.bulk import log_action

__all__ = ["JobPage", "action_log", "charts", "count_jobs", "explore_jobs", "pause_route", "resume_route",
           "route_states", "workers"]

Row = dict[str, Any]
Key = tuple[datetime, uuid.UUID]


@dataclass(frozen=True)
class JobPage:
    """A page of the explorer, newest first, and the key after which the next page starts."""

    items: list[Row]
    next_key: Key | None


def explore_jobs(pool: ConnectionPool[DictConnection], job_filter: JobFilter, *,
                 after: Key | None, limit: int) -> JobPage:
    """Returns a page of the jobs a filter reaches, across orgs, newest first.

    Args:
        pool: database pool.
        job_filter: which jobs.
        after: the previous page's `next_key` (None: the newest jobs).
        limit: the most jobs answered.
    """
    params = {**job_filter.params(), "after_at": after[0] if after else None,
              "after_id": after[1] if after else None, "limit": limit + 1}
    with pool.connection() as conn, conn.transaction():
        conn.execute(q.CONSOLE_PLAN_SETTINGS)
        rows = conn.execute(q.JOB_LIST_FOR_CONSOLE_PAGE, params).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    return JobPage(rows, (rows[-1]["created_at"], rows[-1]["id"]) if more else None)


def count_jobs(pool: ConnectionPool[DictConnection], job_filter: JobFilter, cap: int) -> int:
    """Counts the jobs a filter reaches, reading no further than `cap` of them."""
    params = {**job_filter.params(), "after_at": None, "after_id": None, "cap": cap}
    with pool.connection() as conn, conn.transaction():
        conn.execute(q.CONSOLE_PLAN_SETTINGS)
        row = conn.execute(q.JOB_COUNT_FOR_CONSOLE_CAPPED, params).fetchone()
    assert row is not None
    return int(row["jobs"])


def action_log(pool: ConnectionPool[DictConnection], *, before: int | None,
               limit: int) -> tuple[list[Row], int | None]:
    """A page of the operators' log, newest first, and the id the next page starts before."""
    with pool.connection() as conn:
        rows = conn.execute(audit_q.OPS_ACTION_LIST_PAGE,
                            {"before": before, "limit": limit + 1}).fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (int(rows[-1]["id"]) if more else None)


def route_states(pool: ConnectionPool[DictConnection], routes: Routes,
                 window: float) -> list[Row]:
    """Every configured route (and any other the database knows) with its pause and window.

    Args:
        pool: database pool.
        routes: the configured routes (their limits).
        window: SA_ROUTE_LIMIT_WINDOW, the seconds the `requests` and `tokens` counts span.

    Returns:
        One item per route: name, models, rpm, tpm, paused_until, paused_seconds, reason (the
        pause's, while it lasts), window_start, requests and tokens (the current window's).
    """
    with pool.connection() as conn:
        found = {r["route"]: r for r in conn.execute(route_q.ROUTE_STATES,
                                                     {"window": window}).fetchall()}
    items = []
    names = [r.name for r in routes.routes] + sorted(set(found) - {r.name for r in routes.routes})
    configured = {r.name: r for r in routes.routes}
    for name in names:
        row = found.get(name, {})
        route = configured.get(name)
        items.append({
            "name": name, "configured": route is not None,
            "models": list(route.models) if route else [],
            "rpm": route.rpm if route else 0, "tpm": route.tpm if route else 0,
            "paused_until": row.get("paused_until"), "reason": row.get("reason"),
            "paused_seconds": max(0.0, float(row.get("paused_seconds") or 0.0)),
            "window_seconds": window, "window_start": row.get("window_start"),
            "requests": int(row.get("requests") or 0), "tokens": int(row.get("tokens") or 0)})
    return items


def _known(routes: Routes, route: str) -> None:
    if route not in {r.name for r in routes.routes}:
        raise NotFound(f"route {route!r} is not configured (GET /ops/routes lists them)")


def pause_route(pool: ConnectionPool[DictConnection], routes: Routes, operator: Caller,
                route: str, seconds: float, reason: str) -> Row:
    """Pauses a configured route for every worker for `seconds` from now, and logs it.

    Workers see it within half a second (their copy of the pauses); a job that meets
    the pause goes back to the queue without spending an attempt, as after a 429.

    Raises:
        NotFound: no route of this name is configured.
    """
    _known(routes, route)
    with pool.connection() as conn, conn.transaction():
        row = conn.execute(route_q.ROUTE_PAUSE_SET, {"route": route, "seconds": seconds,
                                                     "reason": reason}).fetchone()
        assert row is not None
        action_id = log_action(conn, operator, "pause_route",
                               {"route": route, "seconds": seconds, "reason": reason})
    return {"route": route, "paused_until": row["paused_until"], "action_id": action_id}


def resume_route(pool: ConnectionPool[DictConnection], routes: Routes, operator: Caller,
                 route: str) -> Row:
    """Ends a configured route's pause now (whoever caused it), and logs it.

    Raises:
        NotFound: no route of this name is configured.
    """
    _known(routes, route)
    reason = f"resumed by operator user {operator.user_id} of org {operator.org_id}"
    with pool.connection() as conn, conn.transaction():
        was = conn.execute(route_q.ROUTE_RESUME, {"route": route, "reason": reason}).fetchone()
        action_id = log_action(conn, operator, "resume_route",
                               {"route": route, "was_paused": was is not None})
    return {"route": route, "was_paused": was is not None, "action_id": action_id}


def workers(pool: ConnectionPool[DictConnection], heartbeat_interval: float) -> list[Row]:
    """The running workers, idle ones included: id, host, slots and those in use, when each was
    last heard from, its jobs' last heartbeat and oldest claim, and their orgs."""
    with pool.connection() as conn:
        return conn.execute(worker_q.WORKER_LIST_SEEN_SINCE, {
            "seconds": presence.STALE_AFTER_BEATS * heartbeat_interval}).fetchall()



def charts(pool: ConnectionPool[DictConnection], since: datetime) -> list[Row]:
    """Per minute since `since`: jobs enqueued, succeeded and failed, wait and run p50/p95, the
    errors by kind and the reported tokens by route."""
    with pool.connection() as conn:
        return conn.execute(q.JOB_EVENT_PER_MINUTE_SINCE, {"since": since}).fetchall()
