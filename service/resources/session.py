"""/session: the mission page's sign-in (a token buys a short-lived HttpOnly cookie), who-am-I, sign-out."""

from __future__ import annotations

from datetime import UTC, datetime

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import Caller, close_session, open_session
from service.auth import API_PREFIX, SESSION_COOKIE, invalid_token
from service.contract import read_no_body

__all__ = ["SESSION_TTL_SECONDS", "Session"]

SESSION_TTL_SECONDS = 8 * 3600
"""A session's lifetime (a working day); sign in again with the token after it."""


def _who(caller: Caller) -> dict[str, object]:
    return {"org_id": caller.org_id, "user_id": caller.user_id, "scopes": sorted(caller.scopes)}


class Session:
    """Opens, shows and closes the cookie session of the mission page."""

    def __init__(self, pool: ConnectionPool[DictConnection], max_per_token: int) -> None:
        self._pool = pool
        self._max_per_token = max_per_token

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Opens a session for the token in the Authorization header: 201 and the cookie.

        A token keeps at most SA_SESSIONS_PER_TOKEN sessions: one more ends its oldest.

        Raises:
            falcon.HTTPBadRequest: the request was authenticated by a cookie, not a token.
        """
        read_no_body(req)
        header = req.get_header("Authorization")
        if header is None:
            raise falcon.HTTPBadRequest(
                title="Token required",
                description="Open a session by presenting a token: Authorization: Bearer <token>.")
        opened = open_session(self._pool, header.strip().partition(" ")[2].strip(" \t"),
                              SESSION_TTL_SECONDS, self._max_per_token)
        if opened is None:
            raise invalid_token()  # NOTE: revoked between the middleware's check and now
        max_age = max(1, int((opened.expires_at - datetime.now(UTC)).total_seconds()))
        # NOTE: HttpOnly keeps it from every script; SameSite=Strict off every other site's
        # requests; the Path keeps it off the pages and every other route of the host; Secure
        # whenever the page was served over https (directly or behind a proxy that says so).
        resp.set_cookie(SESSION_COOKIE, opened.id, max_age=max_age,
                        path=req.root_path + API_PREFIX, http_only=True, same_site="Strict",
                        secure=req.forwarded_scheme == "https")
        resp.status = falcon.HTTP_201
        resp.media = {**_who(req.context.caller), "expires_at": opened.expires_at}

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers who the request acts for: org, user and scopes."""
        resp.media = _who(req.context.caller)

    def on_delete(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Ends the cookie's session at once and tells the browser to drop the cookie: 204."""
        session = req.cookies.get(SESSION_COOKIE)
        if session is not None and req.get_header("Authorization") is None:
            close_session(self._pool, session)
        resp.unset_cookie(SESSION_COOKIE, path=req.root_path + API_PREFIX, same_site="Strict")
        resp.status = falcon.HTTP_204
