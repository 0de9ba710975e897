"""Authentication, deny by default: every route but the PUBLIC_ROUTES needs a bearer token or, from
the mission page's own origin, its session cookie; routes under a SCOPED_PREFIXES prefix need a scope.
"""

from __future__ import annotations

from typing import Any

import falcon

from jobqueue.core.tokens import OPS_READ_SCOPE, OPS_SCOPE, Authenticator, Caller, hash_token

__all__ = ["API_PREFIX", "PAGE_ROUTES", "PUBLIC_ROUTES", "QUERY_TOKEN_PARAM", "QUERY_TOKEN_ROUTES",
           "READ_SCOPES", "SCOPED_PREFIXES", "SESSION_COOKIE", "SESSION_HEADER", "AuthMiddleware",
           "invalid_token"]

API_PREFIX = "/sa-core/v1"

PAGE_ROUTES = frozenset({"/mission", "/mission/ops", "/mission/assets/{name}", "/docs", "/docs/docs.css"})
"""The HTML pages (the mission pages, the API reference) and their static assets: the same for
everyone, no data in them."""

PUBLIC_ROUTES = frozenset({"/healthz", "/readyz", "/metrics", f"{API_PREFIX}/openapi.json",
                           *PAGE_ROUTES})
"""The only routes (Falcon uri_templates) answered without a token.

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

SESSION_COOKIE = "sa_session"
"""The mission page's session cookie (HttpOnly, SameSite=Strict, Path=/sa-core/v1; see
service/resources/session.py), which stands for the token that opened it."""

SESSION_HEADER = "X-SA-Session"
"""Required on every write authenticated by the session cookie (any non-empty value).

NOTE: another origin's page cannot add a custom header to a request without a CORS preflight,
and no preflight is ever granted credentials (service/middleware_security.py), so a forged form
post or image cannot carry it; SameSite=Strict already keeps the cookie off other sites' requests.
"""

SCOPED_PREFIXES = {f"{API_PREFIX}/ops/": OPS_SCOPE}
"""Route prefixes that need a scope on the token, besides a valid token: 403 without it."""

READ_SCOPES = {OPS_SCOPE: OPS_READ_SCOPE}
"""A scope's read-only variant: enough for GET and HEAD under the scope's prefix, 403 otherwise."""

_SAFE_METHODS = frozenset({"GET", "HEAD"})


def invalid_token() -> falcon.HTTPUnauthorized:
    """The 401 for a token that is unknown, revoked or expired, wherever it was found out."""
    return falcon.HTTPUnauthorized(
        title="Invalid token",
        description="The bearer token is unknown, revoked or expired.",
        challenges=["Bearer"],
    )


def _cross_origin(why: str) -> falcon.HTTPForbidden:
    return falcon.HTTPForbidden(
        title="Cross-origin request",
        description=f"The session cookie authenticates requests of this origin's pages only: {why}.",
    )


def _missing_token() -> falcon.HTTPUnauthorized:
    return falcon.HTTPUnauthorized(
        title="Authentication required",
        description="Send Authorization: Bearer <token> (see `sa-core create-token`).",
        challenges=["Bearer"],
    )


class AuthMiddleware:
    """Resolves `Authorization: Bearer <token>`, else the session cookie, to `req.context.caller`.

    Runs in `process_resource`, once the router has chosen the route and before any middleware
    or responder reads a body byte: a request without a valid token is answered 401 from its
    headers alone (RequestLimitsMiddleware, which reads bodies, comes after it).
    """

    def __init__(self, authenticator: Authenticator) -> None:
        self._authenticator = authenticator

    def process_resource(self, req: falcon.Request, resp: falcon.Response, resource: object,
                         params: dict[str, Any]) -> None:
        """Rejects a request to any route but PUBLIC_ROUTES without a valid token (JSON 401).

        The Authorization header wins over the cookie, so a client that sends a token is judged
        by it exactly as before sessions existed.

        Raises:
            falcon.HTTPUnauthorized: no token, a malformed one, or one not valid.
            falcon.HTTPForbidden: a cookie sent from another origin, a cookie-authenticated write
                without SESSION_HEADER, or a token without the scope its route needs.
        """
        route = req.uri_template
        if route in PUBLIC_ROUTES:
            return
        if req.method == "OPTIONS":
            # NOTE: a CORS preflight carries no credentials by definition; Falcon's default
            # OPTIONS responder answers it with the route's Allow list and reads nothing.
            return
        header = req.get_header("Authorization")
        session = req.cookies.get(SESSION_COOKIE)
        if header is None and session is not None:
            self._from_session(req, session)
        else:
            self._from_token(req, header)
        _check_scope(route or "", req.context.caller, req.method)

    def _from_token(self, req: falcon.Request, header: str | None) -> None:
        if header is None and req.method == "GET" and req.uri_template in QUERY_TOKEN_ROUTES:
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

    def _from_session(self, req: falcon.Request, session: str) -> None:
        """Authenticates by the session cookie, for a request of this origin's own pages only."""
        _require_same_origin(req)
        if req.method not in _SAFE_METHODS and not req.get_header(SESSION_HEADER):
            raise _cross_origin(f"a write must carry the {SESSION_HEADER} header")
        found = None
        if session.isascii() and session.isprintable() and 0 < len(session) <= 128:
            found = self._authenticator.authenticate_session(session)
        if found is None:
            raise falcon.HTTPUnauthorized(
                title="Session ended",
                description="The session is unknown, expired or signed out, or its token was "
                            "revoked; sign in again with a token.",
                challenges=["Bearer"],
            )
        req.context.caller, req.context.token_digest = found


def _require_same_origin(req: falcon.Request) -> None:
    """Refuses a cookie-carrying request that a browser marks as coming from another origin.

    NOTE: SameSite=Strict keeps the cookie off cross-site requests, but a sibling origin of the
    same site (another port or subdomain) would still send it. Browsers mark every request with
    Sec-Fetch-Site, and add Origin to every non-GET and CORS request; either one naming another
    origin ends it here.
    """
    site = req.get_header("Sec-Fetch-Site")
    if site is not None and site != "same-origin":
        raise _cross_origin(f"Sec-Fetch-Site is {site}")
    origin = req.get_header("Origin")
    if origin is not None and origin != f"{req.forwarded_scheme}://{req.forwarded_host}":
        raise _cross_origin("the Origin header names another origin")


def _check_scope(route: str, caller: Caller, method: str) -> None:
    for prefix, scope in SCOPED_PREFIXES.items():
        if not route.startswith(prefix) or scope in caller.scopes:
            continue
        reader = READ_SCOPES.get(scope)
        if reader is not None and reader in caller.scopes:
            if method in _SAFE_METHODS:
                continue
            raise falcon.HTTPForbidden(
                title="Read-only scope",
                description=f"This token has the `{reader}` scope: it reads this view but cannot "
                            f"act; acting needs the `{scope}` scope "
                            f"(`sa-core create-token --scope {scope}`).",
            )
        raise falcon.HTTPForbidden(
            title="Scope required",
            description=f"This route needs a token with the `{scope}` scope "
                        f"(`sa-core create-token --scope {scope}`).",
        )
