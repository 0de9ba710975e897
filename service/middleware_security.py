"""Request hygiene before any resource runs (body size and deadline, JSON only), security headers, CORS."""

from __future__ import annotations

import contextlib
import io
import random
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import falcon
import structlog

__all__ = [
    "SECURITY_HEADERS",
    "BodyTimeout",
    "QueryParamsMiddleware",
    "RequestLimitsMiddleware",
    "SecurityHeadersMiddleware",
    "body_deadline",
    "cors_middleware",
]

SECURITY_HEADERS: dict[str, str] = {
    # NOTE: the API answers JSON only; nothing it sends may be sniffed into HTML or script,
    # framed, or cached by a shared cache (answers are per token), or leak a Referer.
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

log = structlog.get_logger(__name__)


class BodyTimeout(Exception):
    """The client did not send its body within the deadline."""


class SecurityHeadersMiddleware:
    """Adds `SECURITY_HEADERS` to every answer, errors included, and `Cache-Control: no-store`
    unless the resource chose a cache policy itself (an SSE stream says `no-cache`).

    A resource that serves a page sets its own Content-Security-Policy, which is kept (only
    for an answer it completed: an error answer is JSON and gets the API's policy).
    """

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         req_succeeded: bool) -> None:
        """Sets the headers; runs for every request, even one a middleware rejected."""
        page_csp = resp.get_header("Content-Security-Policy") if req_succeeded else None
        resp.set_headers(SECURITY_HEADERS)
        if page_csp is not None:
            resp.set_header("Content-Security-Policy", page_csp)
        if resp.get_header("Cache-Control") is None:
            resp.set_header("Cache-Control", "no-store")


class RequestLimitsMiddleware:
    """Reads a request body whole, once the caller is authenticated, and hands it on in memory.

    Refused before a byte is read: a declared body over `max_body_bytes` (413; a route named in
    `route_limits` has its own bound instead) or one that is not JSON (415). Then the body is
    read under one wall-clock deadline of `body_timeout` seconds (SA_BODY_TIMEOUT) to half as
    much again: a client that sends it too slowly gets a JSON 408
    and its connection slot back; a chunked body is cut one byte past the limit (413); a body
    that ends early or is malformed (an aborted chunked upload) is a 400. Resources then parse
    the buffered copy.

    NOTE: it runs in `process_resource`, after AuthMiddleware's, so no body byte is ever read for
    a request without a valid token.
    """

    def __init__(self, max_body_bytes: int, body_timeout: float,
                 route_limits: Mapping[str, tuple[int, str]] | None = None) -> None:
        self._max = max_body_bytes
        self._timeout = body_timeout
        self._route_limits = dict(route_limits or {})

    def process_resource(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         params: dict[str, Any]) -> None:
        """Checks size, then media type, then reads any body sent with POST, PUT or PATCH.

        Raises:
            falcon.HTTPContentTooLarge: the body is larger than the limit.
            falcon.HTTPUnsupportedMediaType: a body that is not `application/json` (UTF-8).
            falcon.HTTPInvalidHeader: Content-Length is not a number.
            falcon.HTTPError: 408 when the body did not arrive within the deadline.
            falcon.HTTPBadRequest: the body ended early or its chunked framing is broken.
        """
        if req.method not in _BODY_METHODS or resource is None:
            return
        if getattr(resource, "streams_body", False):
            # NOTE: a file upload streams its own body to storage under its own limits.
            return
        limit, setting = self._route_limits.get(req.uri_template or "",
                                                (self._max, "SA_MAX_BODY_BYTES"))
        length = req.content_length
        chunked = "chunked" in (req.get_header("Transfer-Encoding") or "").lower()
        if length is not None and length > limit:
            raise _too_large(limit, setting)
        if not length and not chunked:
            return
        if not _is_json(req.content_type):
            raise falcon.HTTPUnsupportedMediaType(
                title="Unsupported media type",
                description="Request bodies must be JSON: send Content-Type: application/json.",
            )
        data = self._read(req.env, length, limit, setting)
        # NOTE: Falcon wraps wsgi.input lazily (bounded_stream), sized by CONTENT_LENGTH; no
        # resource has read it yet, so the buffered body takes its place.
        req.env["wsgi.input"] = req.stream = io.BytesIO(data)
        req.env["CONTENT_LENGTH"] = str(len(data))

    def _read(self, env: dict[str, Any], length: int | None, limit: int, setting: str) -> bytes:
        """Reads `length` bytes, or a chunked body (None) up to one byte past `limit`."""
        # NOTE: jittered, so that a thousand slow clients that arrived together (and reconnect
        # together) are not all answered in the same instant, a burst that would stall every
        # other request of the process for as long as it takes to answer them.
        timeout = self._timeout * random.uniform(1.0, 1.5)
        try:
            with body_deadline(timeout, env):
                data: bytes = env["wsgi.input"].read(limit + 1 if length is None else length)
        except BodyTimeout:
            log.info("http.body_timeout", timeout_s=round(timeout, 3))
            raise falcon.HTTPError(
                falcon.HTTP_408, title="Request timeout",
                description=f"The request body did not arrive within {timeout:.1f} s.",
            ) from None
        except Exception as exc:
            # NOTE: the WSGI server raises its own types for a client that hung up mid-body or
            # broke the chunked framing; whichever it is, the request is the client's fault.
            log.info("http.body_unreadable", error=type(exc).__name__)
            raise _incomplete() from None
        if length is None and len(data) > limit:
            raise _too_large(limit, setting)
        if length is not None and len(data) < length:
            raise _incomplete()
        return data



def _too_large(limit: int, setting: str) -> falcon.HTTPError:
    return falcon.HTTPContentTooLarge(
        title="Request body too large",
        description=f"The body may be at most {limit} bytes ({setting}).",
    )


def _incomplete() -> falcon.HTTPBadRequest:
    return falcon.HTTPBadRequest(
        title="Incomplete body",
        description="The request body ended early or its chunked framing is malformed.",
    )


@contextlib.contextmanager
def body_deadline(seconds: float, env: Mapping[str, Any]) -> Iterator[None]:
    """Raises BodyTimeout from a body read that runs past `seconds` of wall-clock time.

    Under gunicorn's gevent worker (the Procfile's) a gevent.Timeout interrupts the read however
    the client spaces its bytes. Under a threaded or sync worker the socket's timeout bounds each
    wait for a byte instead (a client dripping one byte per wait can stretch that). A body already
    in memory (tests' WSGI client) needs no deadline.
    """
    if _gevent_patched():
        import gevent

        with gevent.Timeout(seconds, BodyTimeout):
            yield
        return
    sock = env.get("gunicorn.socket")
    if sock is None:
        yield
        return
    previous = sock.gettimeout()
    sock.settimeout(seconds)
    try:
        yield
    except TimeoutError:
        raise BodyTimeout() from None
    finally:
        sock.settimeout(previous)


def _gevent_patched() -> bool:
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("socket"))


class QueryParamsMiddleware:
    """Refuses query parameters an API route does not document (400 naming the first one), so a
    misspelt filter (`?snce=...`) is an error instead of being silently ignored.

    The allowed names come from the OpenAPI document, so the two cannot disagree. Routes outside
    `prefix` (health, metrics) are left alone: scrapers and probes add parameters of their own.
    """

    def __init__(self, document: dict[str, Any], prefix: str) -> None:
        self._prefix = prefix
        self._allowed: dict[tuple[str, str], frozenset[str]] = {
            (method.upper(), path): frozenset(
                p["name"] for p in operation.get("parameters", []) if p["in"] == "query")
            for path, item in document["paths"].items()
            for method, operation in item.items()
        }

    def process_resource(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         params: dict[str, Any]) -> None:
        """Checks the query of a routed API request.

        Raises:
            falcon.HTTPInvalidParam: a parameter the route does not take.
        """
        template = re.sub(r"\{(\w+):\w+\}", r"{\1}", req.uri_template or "")
        if resource is None or not template.startswith(self._prefix) or not req.params:
            return
        allowed = self._allowed.get((req.method, template))
        if allowed is None:
            return  # NOTE: OPTIONS (CORS preflight) and the like, answered by Falcon itself
        unknown = sorted(set(req.params) - allowed)
        if unknown:
            accepted = ", ".join(sorted(allowed)) or "none"
            raise falcon.HTTPInvalidParam(f"unknown query parameter (accepted: {accepted})",
                                          unknown[0])


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    media, params = falcon.parse_header(content_type)
    charset = params.get("charset", "utf-8").lower()
    return media.lower() == falcon.MEDIA_JSON and charset in ("utf-8", "utf8")


def cors_middleware(origins: Sequence[str]) -> object | None:
    """Returns Falcon's CORS middleware for `origins` (`SA_CORS_ORIGINS`), or None when empty.

    CORS is off by default: without the middleware no `Access-Control-*` header is ever sent,
    so browsers keep other sites' scripts from reading the API. Credentials (cookies) are never
    allowed; the API authenticates with a Bearer header, which a page must set explicitly.
    """
    if not origins:
        return None
    allow: str | list[str] = "*" if list(origins) == ["*"] else list(origins)
    # NOTE: typed as object: Falcon types this universal (WSGI and ASGI) middleware with ASGI
    # bounds only; at run time it serves WSGI apps the same way.
    return falcon.CORSMiddleware(
        allow_origins=allow,
        expose_headers=["Location", "Retry-After", "Idempotent-Replayed", "Preference-Applied",
                        "SA-Wait-Skipped"],
    )
