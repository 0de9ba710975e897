"""Bearer-token authentication for every route under /sa-core/v1."""

from __future__ import annotations

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.db import DictConnection
from jobqueue.tokens import authenticate

__all__ = ["API_PREFIX", "QUERY_TOKEN_PARAM", "QUERY_TOKEN_PATHS", "AuthMiddleware"]

API_PREFIX = "/sa-core/v1"
PUBLIC_PATHS = frozenset({f"{API_PREFIX}/openapi.json"})

QUERY_TOKEN_PARAM = "access_token"
"""Query parameter (RFC 6750 section 2.3) that may carry the token on QUERY_TOKEN_PATHS only."""

# NOTE: a token in a URL can end up in proxy and server access logs, browser history and
# Referer headers, so it is accepted only where a header cannot be sent: a browser
# EventSource cannot set Authorization. The header still wins when both are present.
QUERY_TOKEN_PATHS = frozenset({f"{API_PREFIX}/mission/events"})


class AuthMiddleware:
    """Resolves `Authorization: Bearer <token>` to `req.context.caller` (org and user)."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Rejects API requests without a valid token with a JSON 401."""
        if not req.path.startswith(API_PREFIX + "/") or req.path in PUBLIC_PATHS:
            return
        if req.method == "OPTIONS":
            # NOTE: a CORS preflight carries no credentials by definition; Falcon's default
            # OPTIONS responder answers it with the route's Allow list and reads nothing.
            return
        scheme, _, token = (req.get_header("Authorization") or "").partition(" ")
        token = token.strip()
        if not scheme and req.method == "GET" and req.path in QUERY_TOKEN_PATHS:
            scheme, token = "bearer", (req.get_param(QUERY_TOKEN_PARAM) or "").strip()
        if scheme.lower() != "bearer" or not token:
            raise falcon.HTTPUnauthorized(
                title="Authentication required",
                description="Send Authorization: Bearer <token> (see `sa-core create-token`).",
                challenges=["Bearer"],
            )
        caller = authenticate(self._pool, token) if token.isascii() else None
        if caller is None:
            raise falcon.HTTPUnauthorized(
                title="Invalid token",
                description="The bearer token is unknown, revoked or expired.",
                challenges=["Bearer"],
            )
        req.context.caller = caller
