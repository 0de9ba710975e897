"""Bearer-token authentication for every route under /sa-core/v1."""

from __future__ import annotations

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import BearerToken, authenticate

__all__ = ["API_PREFIX", "DEFERRED_MAX_BODY_BYTES", "DEFERRED_ROUTES", "QUERY_TOKEN_PARAM",
           "QUERY_TOKEN_PATHS", "AuthMiddleware", "invalid_token"]

API_PREFIX = "/sa-core/v1"
PUBLIC_PATHS = frozenset({f"{API_PREFIX}/openapi.json"})

QUERY_TOKEN_PARAM = "access_token"
"""Query parameter (RFC 6750 section 2.3) that may carry the token on QUERY_TOKEN_PATHS only."""

# NOTE: a token in a URL can end up in proxy and server access logs, browser history and
# Referer headers, so it is accepted only where a header cannot be sent: a browser
# EventSource cannot set Authorization. The header still wins when both are present.
QUERY_TOKEN_PATHS = frozenset({f"{API_PREFIX}/mission/events"})

DEFERRED_ROUTES = frozenset({("POST", f"{API_PREFIX}/prompt")})
"""Routes whose resource hands the token to a statement that checks it itself.

PERF: POST /prompt is the hot path; its enqueue statement checks the token (jobqueue.engine.enqueue),
which saves the separate lookup's round trip. The token is still checked on every request, so a
revoke takes effect at once. A body the resource refuses has its token looked up first, so a bad
token answers 401 whatever the body, as on every other route.
"""

DEFERRED_MAX_BODY_BYTES = 16_384
"""Largest body a DEFERRED_ROUTES request may have for its token check to be deferred.

NOTE: a deferred check lets a client without a valid token make the server parse its body.
Up to this size that costs about what the skipped lookup would; a larger body is only parsed
once the token has been looked up on its own, as on every other route.
"""


def invalid_token() -> falcon.HTTPUnauthorized:
    """The 401 for a token that is unknown, revoked or expired, wherever it was found out."""
    return falcon.HTTPUnauthorized(
        title="Invalid token",
        description="The bearer token is unknown, revoked or expired.",
        challenges=["Bearer"],
    )


class AuthMiddleware:
    """Resolves `Authorization: Bearer <token>` to `req.context.caller` (org and user).

    On DEFERRED_ROUTES (with a small body) it sets `req.context.token` instead, unchecked, for
    the resource's statement to check; the resource then sets `req.context.caller`.
    """

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
        if not token.isascii():
            raise invalid_token()
        if ((req.method, req.path) in DEFERRED_ROUTES
                and (req.content_length or 0) <= DEFERRED_MAX_BODY_BYTES):
            req.context.token = BearerToken.presented(token)
            return
        caller = authenticate(self._pool, token)
        if caller is None:
            raise invalid_token()
        req.context.caller = caller
        # NOTE: the SSE resource caps and ends streams by the token they were opened with.
        req.context.token = BearerToken.presented(token)
