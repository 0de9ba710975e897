"""Bearer-token authentication for every route under /sa-core/v1."""

from __future__ import annotations

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.db import DictConnection
from jobqueue.tokens import authenticate

__all__ = ["API_PREFIX", "AuthMiddleware"]

API_PREFIX = "/sa-core/v1"
PUBLIC_PATHS = frozenset({f"{API_PREFIX}/openapi.json"})


class AuthMiddleware:
    """Resolves `Authorization: Bearer <token>` to `req.context.caller` (org and user)."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Rejects API requests without a valid token with a JSON 401."""
        if not req.path.startswith(API_PREFIX + "/") or req.path in PUBLIC_PATHS:
            return
        scheme, _, token = (req.get_header("Authorization") or "").partition(" ")
        token = token.strip()
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
