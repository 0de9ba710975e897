"""The Falcon app factory: routes, auth, JSON handling, and the one place errors map to HTTP."""

from __future__ import annotations

import atexit
from functools import partial
from typing import Any

import falcon
import psycopg
import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core import metrics
from jobqueue.core.console import BulkAction
from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.dbcheck import DatabaseRefused, check_urls
from jobqueue.core.errors import Conflict, InvalidInput, JobQueueError, NotFound, TryLater
from jobqueue.core.exposition import ProcessFigures
from jobqueue.core.listener import NotificationListener
from jobqueue.core.logs import configure_logging
from jobqueue.core.queries.token import TOKEN_REVOKED_LISTEN
from jobqueue.core.settings import Settings, SettingsError
from jobqueue.core.tokens import Authenticator
from service.auth import API_PREFIX, AuthMiddleware
from service.events.hub import EventHub
from service.middleware import RequestContextMiddleware
from service.middleware_security import (
    QueryParamsMiddleware,
    RequestLimitsMiddleware,
    SecurityHeadersMiddleware,
    cors_middleware,
)
from service.middleware_turns import TurnsMiddleware
from service.openai.routes import add_openai_routes
from service.openapi.document import OPENAPI_PATH, OpenApiDocument, build_openapi
from service.resources.control import JobCancel, PromptRetry
from service.resources.docs import DOCS_PATH, STYLESHEET_PATH, ApiDocs, ApiDocsStylesheet
from service.resources.events import MissionEvents
from service.resources.health import Health, Ready
from service.resources.jobs import JobItem
from service.resources.metrics import Metrics
from service.resources.mission import MissionFeeds
from service.resources.ops import OpsCancel, OpsOverview, OpsRetry
from service.resources.ops_console import (
    OpsActions,
    OpsBulk,
    OpsCharts,
    OpsJob,
    OpsJobCount,
    OpsJobs,
    OpsRouteAction,
    OpsRoutes,
    OpsWorkers,
)
from service.resources.pages import Asset, Page, load_static
from service.resources.prompts import PromptBatch, PromptCollection, PromptItem
from service.resources.responses import ResponseItem
from service.resources.session import Session
from service.resources.usage import OrgUsage
from service.serialize import json_handler, serialize_error
from service.turns import Turns
from service.waits import Waits

__all__ = ["create_app"]

log = structlog.get_logger(__name__)

TURN_ROUTES = frozenset({
    ("GET", f"{API_PREFIX}/mission/recent"),
    ("GET", f"{API_PREFIX}/mission/prompts"),
    ("GET", f"{API_PREFIX}/prompts/{{prompt_id:uuid}}"),
    ("GET", f"{API_PREFIX}/jobs/{{job_id:uuid}}"),
    ("GET", f"{API_PREFIX}/responses/{{response_id:uuid}}"),
    ("GET", f"{API_PREFIX}/usage"),
    ("POST", f"{API_PREFIX}/session"),
})
"""The requests that take their token's turn (service/turns.py): pages a client can ask for
back to back whose cost grows with what they carry, and sign-ins, which write."""

_STATUS: dict[type[JobQueueError], str] = {
    NotFound: falcon.HTTP_404,
    Conflict: falcon.HTTP_409,
    InvalidInput: falcon.HTTP_422,
    TryLater: falcon.HTTP_429,
}


def _domain_error(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    assert isinstance(ex, JobQueueError)
    status = next((s for cls, s in _STATUS.items() if isinstance(ex, cls)), falcon.HTTP_400)
    headers = {"Retry-After": str(ex.retry_after)} if isinstance(ex, TryLater) else None
    raise falcon.HTTPError(status, title=ex.title, description=ex.description, headers=headers)


def _database_down(req: falcon.Request, resp: falcon.Response, ex: Exception,
                   params: Any) -> None:
    log.warning("http.database_unavailable", path=req.path, error=type(ex).__name__)
    raise falcon.HTTPServiceUnavailable(
        title="Database unavailable",
        description="The database cannot be reached; retry shortly.",
        retry_after=2,
    )


def _unexpected(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    if isinstance(ex, falcon.HTTPError):
        raise ex
    log.exception("http.unhandled_error", path=req.path, method=req.method)
    raise falcon.HTTPInternalServerError(
        title="Internal error", description="The error was logged; please report it."
    )


_HEARD_TTL = 60.0
"""Seconds a valid token stays remembered while revocations are heard (see Authenticator)."""


_FIGURES_INTERVAL = 5.0
"""Seconds between refreshes of a web process's own gauges (pool, open streams, waits)."""


def _report_streams(hub: EventHub) -> None:
    metrics.SSE_STREAMS_OPEN.set(hub.subscriber_count)


def _report_waits(waits: Waits) -> None:
    metrics.WAITS_OPEN.set(waits.held)


def _caching_authenticator(pool: ConnectionPool[DictConnection],
                           settings: Settings) -> Authenticator:
    """An Authenticator that remembers valid tokens, told of revocations by a LISTEN.

    With SA_LISTEN=0 (or while the LISTEN connection is down) entries live SA_TOKEN_CACHE_TTL
    seconds only; a reconnected LISTEN forgets everything, as it may have missed a revoke.
    """
    authenticator = Authenticator(pool, ttl=_HEARD_TTL,
                                  fallback_ttl=settings.token_cache_ttl)
    if settings.listen:
        listener = NotificationListener(settings.direct_database_url, TOKEN_REVOKED_LISTEN,
                                        authenticator.forget, authenticator.clear).start()
        authenticator.revocations = listener.listening
        atexit.register(listener.stop)
    return authenticator


_BOOT_ERROR = 3
"""gunicorn's WORKER_BOOT_ERROR: a worker exiting with it makes the master stop, not respawn it."""


def _open_own(settings: Settings | None) -> tuple[Settings, ConnectionPool[DictConnection]]:
    """Reads the settings and opens the web's pool; a problem retrying cannot fix (a setting, a
    refused connection) is one log line and the end of the web (gunicorn stops, exit code 3)."""
    try:
        settings = settings or Settings.from_env()
        check_urls({"DATABASE_URL": settings.database_url,
                    **({"SA_DIRECT_DATABASE_URL": settings.direct_database_url} if settings.listen else {})})
        pool = open_pool(settings.database_url, name="web", max_size=settings.pool_max_size,
                         checkout_timeout=5.0, prepare=settings.prepared_statements)
    except (SettingsError, DatabaseRefused) as exc:
        log.error("web.cannot_start", reason=str(exc))
        raise SystemExit(_BOOT_ERROR) from None
    return settings, pool


def create_app(
    settings: Settings | None = None,
    pool: ConnectionPool[DictConnection] | None = None,
    hub: EventHub | None = None,
) -> falcon.App[falcon.Request, falcon.Response]:
    """Builds the WSGI app; opens its own pool unless one is given (tests share theirs).

    Args:
        settings: configuration; read from the environment when None.
        pool: an open pool to use instead of opening one.
        hub: the SSE event hub to use; by default one per app (so one per gunicorn worker
            process), started by the first GET /mission/events or /mission/recent.

    Returns:
        The Falcon app. With its own pool it caches valid tokens and LISTENs for revocations;
        with a given pool (tests) it looks every token up.
    """
    # NOTE: as gunicorn_conf.JsonLogger: no log thread in a process gevent may patch (LineLogger).
    configure_logging(buffered=False)
    owns_pool = pool is None
    if pool is None:
        settings, pool = _open_own(settings)
        # NOTE: closed at exit, not left to the garbage collector: under gevent a pool finalized
        # during interpreter shutdown fails to join its worker threads and prints a traceback.
        atexit.register(pool.close)
        authenticator = _caching_authenticator(pool, settings)
    else:
        settings = settings or Settings.from_env()
        authenticator = Authenticator(pool)
    # NOTE: the request context comes first, so its request id, log line and latency cover auth
    # too. Auth judges the routed request from its headers; only then are body limits checked
    # and the body read (both in process_resource, in this order).
    cors = cors_middleware(settings.cors_origins)
    document = build_openapi(settings)
    middleware: list[Any] = [RequestContextMiddleware(), SecurityHeadersMiddleware(),
                             *([cors] if cors else []), AuthMiddleware(authenticator),
                             TurnsMiddleware(Turns(settings.token_read_share,
                                                   settings.token_read_queue,
                                                   settings.token_read_wait), TURN_ROUTES),
                             RequestLimitsMiddleware(settings.max_body_bytes, settings.body_timeout, {
                                 f"{API_PREFIX}/prompts/batch": (settings.batch_max_bytes,
                                                                 "SA_BATCH_MAX_BYTES")}),
                             QueryParamsMiddleware(document, API_PREFIX + "/")]
    app = falcon.App(middleware=middleware)
    handler = json_handler()
    app.req_options.media_handlers[falcon.MEDIA_JSON] = handler
    app.resp_options.media_handlers[falcon.MEDIA_JSON] = handler
    app.req_options.strip_url_path_trailing_slash = True
    app.set_error_serializer(serialize_error)

    app.add_route("/healthz", Health())
    app.add_route("/readyz", Ready(pool))
    hub = hub or EventHub.from_settings(pool, settings)
    # NOTE: one per app, so one per web process: the wait caps are per process.
    waits = Waits(settings.wait_max_per_token, settings.wait_max)
    figures = (ProcessFigures().add_pool(pool).add(partial(_report_streams, hub))
               .add(partial(_report_waits, waits)))
    if owns_pool:
        # NOTE: keeps the files of the processes a scrape does not reach current (exposition.py).
        figures.start(_FIGURES_INTERVAL)
    app.add_route("/metrics", Metrics(pool, figures))
    app.add_route(OPENAPI_PATH, OpenApiDocument(document))
    app.add_route(DOCS_PATH, ApiDocs(document))
    app.add_route(STYLESHEET_PATH, ApiDocsStylesheet())
    app.add_route(f"{API_PREFIX}/prompt", PromptCollection(pool, settings, hub, waits))
    app.add_route(f"{API_PREFIX}/prompts/batch", PromptBatch(pool, settings))
    app.add_route(f"{API_PREFIX}/prompts/{{prompt_id:uuid}}", PromptItem(pool, settings))
    app.add_route(f"{API_PREFIX}/jobs/{{job_id:uuid}}", JobItem(pool))
    app.add_route(f"{API_PREFIX}/jobs/{{job_id:uuid}}/cancel", JobCancel(pool))
    app.add_route(f"{API_PREFIX}/responses/{{response_id:uuid}}", ResponseItem(pool))
    app.add_route(f"{API_PREFIX}/prompts/{{prompt_id:uuid}}/retry",
                  PromptRetry(pool, settings.org_max_queued, settings.budgets))
    feeds = MissionFeeds(pool, hub, settings)
    app.add_route(f"{API_PREFIX}/mission/recent", feeds)
    app.add_route(f"{API_PREFIX}/mission/prompts", feeds, suffix="prompts")
    app.add_route(f"{API_PREFIX}/mission/events",
                  MissionEvents(pool, hub, keepalive=settings.sse_keepalive,
                                replay_limit=settings.sse_replay_limit,
                                page_bytes=settings.page_max_bytes))
    app.add_route(f"{API_PREFIX}/session", Session(pool, settings.sessions_per_token))
    app.add_route(f"{API_PREFIX}/usage", OrgUsage(pool, settings))
    app.add_route(f"{API_PREFIX}/ops/overview", OpsOverview(pool))
    app.add_route(f"{API_PREFIX}/ops/jobs/{{job_id:uuid}}/cancel", OpsCancel(pool))
    app.add_route(f"{API_PREFIX}/ops/jobs/{{job_id:uuid}}/retry", OpsRetry(pool))
    app.add_route(f"{API_PREFIX}/ops/jobs", OpsJobs(pool, settings))
    app.add_route(f"{API_PREFIX}/ops/jobs/count", OpsJobCount(pool, settings))
    app.add_route(f"{API_PREFIX}/ops/jobs/{{job_id:uuid}}", OpsJob(pool))
    app.add_route(f"{API_PREFIX}/ops/bulk/cancel", OpsBulk(pool, settings, BulkAction.CANCEL))
    app.add_route(f"{API_PREFIX}/ops/bulk/retry", OpsBulk(pool, settings, BulkAction.RETRY))
    app.add_route(f"{API_PREFIX}/ops/actions", OpsActions(pool))
    app.add_route(f"{API_PREFIX}/ops/routes", OpsRoutes(pool, settings))
    app.add_route(f"{API_PREFIX}/ops/routes/pause", OpsRouteAction(pool, settings, pause=True))
    app.add_route(f"{API_PREFIX}/ops/routes/resume", OpsRouteAction(pool, settings, pause=False))
    app.add_route(f"{API_PREFIX}/ops/workers", OpsWorkers(pool, settings.heartbeat_interval))
    app.add_route(f"{API_PREFIX}/ops/charts", OpsCharts(pool))
    add_openai_routes(app, pool, settings, hub, waits)
    # NOTE: the pages live at the root, outside the versioned JSON API: they are HTML, and the
    # session cookie's Path (/sa-core/v1) keeps it off them.
    static = load_static()
    app.add_route("/mission", Page(static, "mission.html"))
    app.add_route("/mission/ops", Page(static, "ops.html"))
    app.add_route("/mission/assets/{name}", Asset(static))

    app.add_error_handler(Exception, _unexpected)
    app.add_error_handler(psycopg.OperationalError, _database_down)
    app.add_error_handler(JobQueueError, _domain_error)
    return app
