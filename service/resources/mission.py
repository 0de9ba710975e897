"""GET /mission/recent, the polling feed (a page of the event log the SSE stream follows), and
GET /mission/prompts, the page's first load (the present state, as of a log position)."""

from __future__ import annotations

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from service.contract import RECENT_LIMIT, SNAPSHOT_LIMIT
from service.events.hub import EventHub
from service.holds import Holds
from service.lookup import recent_changes
from service.parsers import (
    encode_cursor,
    parse_cursor,
    parse_limit,
    parse_org_wide,
    parse_since,
)
from service.snapshot import latest_prompts

__all__ = ["MissionFeeds"]

HUB_WAIT_SECONDS = 2.0
"""How long a poll waits for a hub that is starting; past it the page is empty and continues."""


class MissionFeeds:
    """The viewer's prompts: those that changed, a page at a time (pass `next_cursor` back as
    `cursor`), and, on the `prompts` suffix, the latest ones as of `event_id` (pass
    `next_before` back as `before` for older ones)."""

    def __init__(self, pool: ConnectionPool[DictConnection], hub: EventHub,
                 settings: Settings) -> None:
        self._pool = pool
        self._hub = hub
        self._text_chars = settings.feed_text_max_chars
        self._max_bytes = settings.page_max_bytes
        self._holds = Holds(settings.org_max_running, settings.budgets)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers `{as_of, items, next_cursor, has_more}`."""
        after = parse_cursor(req.get_param("cursor"))
        since = parse_since(req.get_param("since"))
        limit = parse_limit(req, RECENT_LIMIT)
        org_wide = parse_org_wide(req.get_param("scope"))
        page = recent_changes(self._pool, req.context.caller, upto=self._hub.wait_ready(
            HUB_WAIT_SECONDS), after=after, since=since, limit=limit,
            text_chars=self._text_chars, max_bytes=self._max_bytes, holds=self._holds,
            org_wide=org_wide)
        resp.media = {**page, "next_cursor": encode_cursor(page["next_cursor"])}

    def on_get_prompts(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers `{as_of, event_id, cursor, items, next_before, has_more}`."""
        before = parse_cursor(req.get_param("before"), "before")
        limit = parse_limit(req, SNAPSHOT_LIMIT)
        org_wide = parse_org_wide(req.get_param("scope"))
        page = latest_prompts(self._pool, req.context.caller, upto=self._hub.wait_ready(
            HUB_WAIT_SECONDS), before=before, limit=limit, text_chars=self._text_chars,
            max_bytes=self._max_bytes, holds=self._holds, org_wide=org_wide)
        after = page["next_before"]
        resp.media = {**page, "next_before": None if after is None else encode_cursor(after),
                      "cursor": None if page["event_id"] is None else encode_cursor(page["event_id"])}
