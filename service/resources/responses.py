"""GET /responses/{id}: a response whole (the feeds carry at most SA_FEED_TEXT_MAX_CHARS of it)."""

from __future__ import annotations

import uuid

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from service.lookup import get_response

__all__ = ["ResponseItem"]


class ResponseItem:
    """One response, as its owner's org sees it."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_get(self, req: falcon.Request, resp: falcon.Response, response_id: uuid.UUID) -> None:
        """Answers the response, or 404 when it is not the caller's org's."""
        resp.media = get_response(self._pool, req.context.caller, response_id)
