"""Request hygiene before any resource runs (body size, JSON only), security headers and CORS."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

import falcon

__all__ = [
    "SECURITY_HEADERS",
    "QueryParamsMiddleware",
    "RequestLimitsMiddleware",
    "SecurityHeadersMiddleware",
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


class SecurityHeadersMiddleware:
    """Adds `SECURITY_HEADERS` to every answer, errors included, and `Cache-Control: no-store`
    unless the resource chose a cache policy itself (an SSE stream says `no-cache`)."""

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         req_succeeded: bool) -> None:
        """Sets the headers; runs for every request, even one a middleware rejected."""
        resp.set_headers(SECURITY_HEADERS)
        if resp.get_header("Cache-Control") is None:
            resp.set_header("Cache-Control", "no-store")


class RequestLimitsMiddleware:
    """Refuses a request body before anything reads it: over `max_body_bytes` (413, judged from
    Content-Length, or by a bounded read of a chunked body) or not JSON (415)."""

    def __init__(self, max_body_bytes: int) -> None:
        self._max = max_body_bytes

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Checks size, then media type, of any body sent with POST, PUT or PATCH.

        Raises:
            falcon.HTTPContentTooLarge: the body is larger than the limit.
            falcon.HTTPUnsupportedMediaType: a body that is not `application/json` (UTF-8).
            falcon.HTTPInvalidHeader: Content-Length is not a number.
        """
        if req.method not in _BODY_METHODS:
            return
        length = req.content_length
        chunked = "chunked" in (req.get_header("Transfer-Encoding") or "").lower()
        if length is not None and length > self._max:
            raise self._too_large()
        if length is None and chunked:
            length = self._buffer_chunked(req)
        if length and not _is_json(req.content_type):
            raise falcon.HTTPUnsupportedMediaType(
                title="Unsupported media type",
                description="Request bodies must be JSON: send Content-Type: application/json.",
            )

    def _buffer_chunked(self, req: falcon.Request) -> int:
        """Reads a chunked body (no Content-Length) up to the limit, and hands it on as a plain one.

        The WSGI server de-chunks `wsgi.input` and ends it at the last chunk; reading one byte
        past the limit tells an oversized body without holding more of it.
        """
        data = req.stream.read(self._max + 1)
        if len(data) > self._max:
            raise self._too_large()
        # NOTE: Falcon wraps wsgi.input lazily (bounded_stream), sized by CONTENT_LENGTH; no
        # resource has read it yet, so the buffered body takes its place.
        req.env["wsgi.input"] = io.BytesIO(data)
        req.env["CONTENT_LENGTH"] = str(len(data))
        return len(data)

    def _too_large(self) -> falcon.HTTPError:
        return falcon.HTTPContentTooLarge(
            title="Request body too large",
            description=f"The body may be at most {self._max} bytes.",
        )


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
        if resource is None or not req.path.startswith(self._prefix) or not req.params:
            return
        template = re.sub(r"\{(\w+):\w+\}", r"{\1}", req.uri_template or "")
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
        expose_headers=["Location", "Retry-After", "Idempotent-Replayed"],
    )
