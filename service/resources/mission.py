"""GET /mission/recent: the polling feed, a page of the same event log the SSE stream follows."""

from __future__ import annotations

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from service.contract import RECENT_LIMIT
from service.events.hub import EventHub
from service.lookup import recent_changes
from service.parsers import (
    encode_cursor,
    parse_cursor,
    parse_limit,
    parse_org_wide,
    parse_since,
)

__all__ = ["MissionRecent"]

HUB_WAIT_SECONDS = 2.0
"""How long a poll waits for a hub that is starting; past it the page is empty and continues."""


class MissionRecent:
    """The viewer's prompts that changed, a page at a time; pass `next_cursor` back as `cursor`."""

    def __init__(self, pool: ConnectionPool[DictConnection], hub: EventHub,
                 settings: Settings) -> None:
        self._pool = pool
        self._hub = hub
        self._text_chars = settings.feed_text_max_chars
        self._max_bytes = settings.page_max_bytes

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers `{as_of, items, next_cursor, has_more}`."""
        after = parse_cursor(req.get_param("cursor"))
        since = parse_since(req.get_param("since"))
        limit = parse_limit(req, RECENT_LIMIT)
        org_wide = parse_org_wide(req.get_param("scope"))
        page = recent_changes(self._pool, req.context.caller, upto=self._hub.wait_ready(
            HUB_WAIT_SECONDS), after=after, since=since, limit=limit,
            text_chars=self._text_chars, max_bytes=self._max_bytes, org_wide=org_wide)
        resp.media = {**page, "next_cursor": encode_cursor(page["next_cursor"])}
