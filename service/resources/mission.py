"""GET /mission/recent: the polling feed."""

from __future__ import annotations

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from service.lookup import recent_changes
from service.validation import parse_since

__all__ = ["MissionRecent"]


class MissionRecent:
    """Prompts changed since a cursor; pass `as_of` back as the next `since`."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers `{as_of, items}`."""
        since = parse_since(req.get_param("since"))
        resp.media = recent_changes(self._pool, req.context.caller, since)
