"""Bearer-token authentication, deny by default: every route but the PUBLIC_ROUTES needs a token."""

from __future__ import annotations

from typing import Any

import falcon

from jobqueue.core.tokens import Authenticator, hash_token

__all__ = ["API_PREFIX", "PUBLIC_ROUTES", "QUERY_TOKEN_PARAM", "QUERY_TOKEN_ROUTES",
           "AuthMiddleware", "invalid_token"]

API_PREFIX = "/sa-core/v1"

PUBLIC_ROUTES = frozenset({"/healthz", "/readyz", "/metrics", f"{API_PREFIX}/openapi.json", "/docs",
                           "/docs/docs.css"})
"""The only routes (Falcon uri_templates) answered without a token; pages join this list.

NOTE: the rule is judged on the route the router chose, never on the raw path: however a path
is spelt (`//sa-core/v1/...`), the route it reaches decides. A path that matches no route is
answered 404 by Falcon before any middleware could read its body.
"""

QUERY_TOKEN_PARAM = "access_token"
"""Query parameter (RFC 6750 section 2.3) that may carry the token on QUERY_TOKEN_ROUTES only."""

# NOTE: a token in a URL can end up in proxy and server access logs, browser history and
# Referer headers, so it is accepted only where a header cannot be sent: a browser
# EventSource cannot set Authorization. The header still wins when both are present.
QUERY_TOKEN_ROUTES = frozenset({f"{API_PREFIX}/mission/events"})


def invalid_token() -> falcon.HTTPUnauthorized:
    """The 401 for a token that is unknown, revoked or expired, wherever it was found out."""
    return falcon.HTTPUnauthorized(
        title="Invalid token",
        description="The bearer token is unknown, revoked or expired.",
        challenges=["Bearer"],
    )


def _missing_token() -> falcon.HTTPUnauthorized:
    return falcon.HTTPUnauthorized(
        title="Authentication required",
        description="Send Authorization: Bearer <token> (see `sa-core create-token`).",
        challenges=["Bearer"],
    )


class AuthMiddleware:
    """Resolves `Authorization: Bearer <token>` to `req.context.caller` (org and user).

    Runs in `process_resource`, once the router has chosen the route and before any middleware
    or responder reads a body byte: a request without a valid token is answered 401 from its
    headers alone (RequestLimitsMiddleware, which reads bodies, comes after it).
    """

    def __init__(self, authenticator: Authenticator) -> None:
        self._authenticator = authenticator

    def process_resource(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         params: dict[str, Any]) -> None:
        """Rejects a request to any route but PUBLIC_ROUTES without a valid token (JSON 401).

        Raises:
            falcon.HTTPUnauthorized: no token, a malformed one, or one not valid.
        """
        route = req.uri_template
        if route in PUBLIC_ROUTES:
            return
        if req.method == "OPTIONS":
            # NOTE: a CORS preflight carries no credentials by definition; Falcon's default
            # OPTIONS responder answers it with the route's Allow list and reads nothing.
            return
        header = req.get_header("Authorization")
        if header is None and req.method == "GET" and route in QUERY_TOKEN_ROUTES:
            header = "Bearer " + (req.get_param(QUERY_TOKEN_PARAM) or "")
        scheme, _, token = (header or "").strip().partition(" ")
        token = token.strip(" \t")
        if scheme.lower() != "bearer" or not token:
            raise _missing_token()
        # NOTE: a token is plain ASCII without spaces; anything else cannot be one, so it is
        # refused without a lookup (and never hashed from an odd encoding).
        if not token.isascii() or not token.isprintable() or " " in token or "\t" in token:
            raise invalid_token()
        caller = self._authenticator.authenticate(token)
        if caller is None:
            raise invalid_token()
        req.context.caller = caller
        # NOTE: the SSE resource caps and ends streams by the token they were opened with.
        req.context.token_digest = hash_token(token)
