"""Per-request context: a request id, one log line and one latency observation per HTTP request."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import falcon
import structlog

from jobqueue.core import metrics

__all__ = ["PROBE_ROUTES", "REQUEST_ID_HEADER", "UNMATCHED_ROUTE", "RequestContextMiddleware"]

REQUEST_ID_HEADER = "X-Request-ID"

UNMATCHED_ROUTE = "unmatched"
"""The `route` label of a request no route matched (404): never the raw path."""

PROBE_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})
"""Routes machines poll; their `http.request` line is at debug unless they answer 5xx."""

# NOTE: a caller's id is echoed into a response header and every log line of the request, so it
# must be short and plain; anything else is replaced by a fresh one.
_ACCEPTABLE_ID = re.compile(r"^[A-Za-z0-9._:/+=@-]{1,128}$")

# NOTE: route parameters worth binding to every log line of the request.
_BOUND_PARAMS = ("job_id", "prompt_id")

log = structlog.get_logger(__name__)


def _request_id(given: str | None) -> str:
    if given is not None and _ACCEPTABLE_ID.match(given):
        return given
    return uuid.uuid4().hex


class RequestContextMiddleware:
    """Must come first in the middleware list, so it brackets everything else (auth included).

    - request id: taken from `X-Request-ID` when acceptable, else generated; returned in the
      response's `X-Request-ID` and bound (structlog contextvars) to every log line of the request;
    - `sa_http_request_seconds{route,method,status}`, where `route` is Falcon's uri_template,
      never the raw path (job ids would make the label set unbounded);
    - one `http.request` log line with method, route, status, duration and the caller's org
      (at debug for PROBE_ROUTES answering below 500).

    NOTE: for a streamed body (SSE) the figures cover the time to the response headers.
    """

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Starts the clock and binds the request id."""
        req.context.started = time.monotonic()
        request_id = _request_id(req.get_header(REQUEST_ID_HEADER))
        req.context.request_id = request_id
        # NOTE: a gthread worker reuses threads; a context left by the previous request must go.
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)

    def process_resource(
        self, req: falcon.Request, resp: falcon.Response, resource: object, params: dict[str, Any]
    ) -> None:
        """Binds the route's job or prompt id to the request's log lines."""
        bound = {name: str(params[name]) for name in _BOUND_PARAMS if name in params}
        if bound:
            structlog.contextvars.bind_contextvars(**bound)

    def process_response(
        self, req: falcon.Request, resp: falcon.Response, resource: object, req_succeeded: bool
    ) -> None:
        """Returns the request id, observes the latency and writes the request's log line."""
        started = getattr(req.context, "started", None)
        elapsed = time.monotonic() - started if started is not None else 0.0
        request_id = getattr(req.context, "request_id", None) or _request_id(None)
        resp.set_header(REQUEST_ID_HEADER, request_id)
        route = req.uri_template or UNMATCHED_ROUTE
        method = req.method if req.method in falcon.COMBINED_METHODS else "OTHER"
        status = resp.status_code
        metrics.HTTP_REQUEST_SECONDS.labels(route=route, method=method, status=str(status)).observe(elapsed)
        caller = getattr(req.context, "caller", None)
        # NOTE: a load balancer's or Prometheus's probe every few seconds would bury the requests
        # people make; one that answers 5xx still shows.
        write = log.debug if route in PROBE_ROUTES and status < 500 else log.info
        write("http.request", method=method, route=route, path=req.path, status=status,
                 duration_ms=round(elapsed * 1000, 3), request_id=request_id,
                 org_id=getattr(caller, "org_id", None), user_id=getattr(caller, "user_id", None))
        structlog.contextvars.clear_contextvars()
