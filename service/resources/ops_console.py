"""/ops/ console routes: the jobs explorer, a job's history, bulk actions, the operators' log,
routes and workers, across orgs.

Every route needs the `ops` scope; its reads also take `ops:read` (service/auth.py). The query
and bodies are parsed by service/ops_contract.py; the work is jobqueue/engine/console.py's and
jobqueue/engine/bulk.py's.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.console import BulkAction
from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.engine import console
from jobqueue.engine.bulk import run_bulk
from jobqueue.engine.inspection import job_details
from service.ops_contract import (
    ACTIONS_BEFORE,
    OPS_BULK_MAX,
    PAUSE_BODY,
    RESUME_BODY,
    parse_bulk_ids,
    parse_cursor,
    parse_filter,
    parse_max_jobs,
    parse_page_limit,
)
from service.parsers import encode_jobs_cursor

__all__ = ["CHART_WINDOW", "OpsActions", "OpsBulk", "OpsCharts", "OpsJob", "OpsJobCount", "OpsJobs",
           "OpsRouteAction", "OpsRoutes", "OpsWorkers"]

_NOT_SENT = object()

CHART_WINDOW = timedelta(hours=1)
"""The span of the console's charts, a minute per point."""


class OpsJobs:
    """GET /ops/jobs: a page of every org's jobs a filter reaches, newest first."""

    def __init__(self, pool: ConnectionPool[DictConnection], settings: Settings) -> None:
        self._pool = pool
        self._routes = settings.routes

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers `{items, next_cursor}`; `next_cursor` is null on the last page."""
        job_filter = parse_filter(req, self._routes)
        page = console.explore_jobs(self._pool, job_filter, after=parse_cursor(req),
                                    limit=parse_page_limit(req))
        resp.media = {"items": page.items,
                      "next_cursor": None if page.next_key is None
                      else encode_jobs_cursor(*page.next_key)}


class OpsJobCount:
    """GET /ops/jobs/count: how many jobs a filter reaches, as a bulk action would."""

    def __init__(self, pool: ConnectionPool[DictConnection], settings: Settings) -> None:
        self._pool = pool
        self._routes = settings.routes

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers `{jobs, cancellable, retryable, max}`, each count read up to `max` + 1."""
        job_filter = parse_filter(req, self._routes)
        cap = OPS_BULK_MAX + 1
        resp.media = {
            "jobs": console.count_jobs(self._pool, job_filter, cap),
            "cancellable": console.count_jobs(self._pool, job_filter.narrowed(BulkAction.CANCEL),
                                              cap),
            "retryable": console.count_jobs(self._pool, job_filter.narrowed(BulkAction.RETRY),
                                            cap),
            "max": OPS_BULK_MAX}


class OpsJob:
    """GET /ops/jobs/{job_id}: one job of any org (archived too) with its whole history."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_get(self, req: falcon.Request, resp: falcon.Response, job_id: uuid.UUID) -> None:
        """Answers `sa-core job-details --json`'s document; 404 for an unknown id."""
        resp.media = job_details(self._pool, job_id).as_dict()


class OpsBulk:
    """POST /ops/bulk/{cancel,retry}: one action on a selection, or on what a filter reaches."""

    def __init__(self, pool: ConnectionPool[DictConnection], settings: Settings,
                 action: BulkAction) -> None:
        self._pool = pool
        self._settings = settings
        self._action = action

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Runs the action in batches of SA_OPS_BULK_BATCH; answers what it did.

        Raises:
            falcon.HTTPUnprocessableEntity: neither ids nor `max_jobs`, or both.
        """
        # NOTE: no body is read when none was sent, whatever Content-Type a server defaults to
        # (wsgiref says text/plain).
        body = req.get_media(default_when_empty=_NOT_SENT) if req.content_length else _NOT_SENT
        ids = parse_bulk_ids(None if body is _NOT_SENT else body)
        job_filter = parse_filter(req, self._settings.routes)
        max_jobs = parse_max_jobs(req)
        if ids and (max_jobs is not None or req.params):
            raise falcon.HTTPUnprocessableEntity(
                title="Invalid request",
                description="Name the jobs either by `ids` in the body or by a filter with "
                            "`max_jobs` in the query, not both.")
        if not ids and max_jobs is None:
            raise falcon.HTTPUnprocessableEntity(
                title="Invalid request",
                description="Give `ids` in the body, or a filter with `max_jobs` (the count you "
                            "were shown by GET /ops/jobs/count) in the query.")
        outcome = run_bulk(self._pool, self._action, req.context.caller, job_filter=job_filter,
                           ids=ids, max_jobs=max_jobs or len(ids),
                           batch_size=min(self._settings.ops_bulk_batch, OPS_BULK_MAX))
        resp.media = outcome.as_dict()


class OpsActions:
    """GET /ops/actions: the operators' log, newest first."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers `{items, next_before}`."""
        before = req.get_param_as_int(ACTIONS_BEFORE.name, min_value=1,
                                      max_value=ACTIONS_BEFORE.schema["maximum"])
        items, next_before = console.action_log(self._pool, before=before,
                                                limit=parse_page_limit(req))
        resp.media = {"items": items, "next_before": next_before}


class OpsRoutes:
    """GET /ops/routes: each route's limits, pause and current window."""

    def __init__(self, pool: ConnectionPool[DictConnection], settings: Settings) -> None:
        self._pool = pool
        self._settings = settings

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers `{items}`."""
        resp.media = {"items": console.route_states(self._pool, self._settings.routes,
                                                    self._settings.route_limit_window)}


class OpsRouteAction:
    """POST /ops/routes/pause and /ops/routes/resume: an operator's pause, or its end."""

    def __init__(self, pool: ConnectionPool[DictConnection], settings: Settings,
                 pause: bool) -> None:
        self._pool = pool
        self._routes = settings.routes
        self._pause = pause

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers the route's new state and the log entry's id; 404 for an unknown route."""
        caller = req.context.caller
        if self._pause:
            body = PAUSE_BODY.check(req.get_media(), "")
            reason = body.get("reason") or (
                f"paused by operator user {caller.user_id} of org {caller.org_id}")
            resp.media = console.pause_route(self._pool, self._routes, caller, body["route"],
                                             body["seconds"], reason)
        else:
            body = RESUME_BODY.check(req.get_media(), "")
            resp.media = console.resume_route(self._pool, self._routes, caller, body["route"])


class OpsWorkers:
    """GET /ops/workers: the running workers, idle ones included."""

    def __init__(self, pool: ConnectionPool[DictConnection], heartbeat_interval: float) -> None:
        self._pool = pool
        self._heartbeat_interval = heartbeat_interval

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers `{items}`: worker_id, host, slots, slots_in_use, started_at, seen_at,
        last_heartbeat, oldest_claim, orgs."""
        resp.media = {"items": console.workers(self._pool, self._heartbeat_interval)}


class OpsCharts:
    """GET /ops/charts: the last hour, a point per minute, for the console's charts."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers `{as_of, minutes: [{minute, enqueued, succeeded, failed, wait_p50, wait_p95,
        run_p50, run_p95}]}` (the seconds null in a minute that measured none)."""
        now = datetime.now(UTC)
        resp.media = {"as_of": now, "minutes": console.charts(self._pool, now - CHART_WINDOW)}
