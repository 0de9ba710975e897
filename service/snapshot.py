"""The mission page's first load: the viewer's prompts, latest activity first, as of a log position.

A page that replayed the event log from its start to learn the present read every transition
ever made (49 pages for 325 prompts with 24,000 state changes). A snapshot reads only the
newest events, newest first, until it has `limit` prompts, and answers each prompt's latest
state with the position it holds for: the SSE stream resumes from that `event_id` (and the
polling feed from that `cursor`), so no change after it is missed, and none before it is needed.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, reconnecting
from jobqueue.core.queries import mission as mission_q
from jobqueue.core.tokens import Caller
from service.holds import Holds
from service.lookup import prompts_latest

__all__ = ["SCAN_EVENTS", "latest_prompts"]

Row = dict[str, Any]

SCAN_EVENTS = 5000
"""Most events one snapshot page walks: a prompt with thousands of retries costs a page of
its own (`has_more`), never an unbounded read."""


def latest_prompts(
    pool: ConnectionPool[DictConnection],
    caller: Caller,
    *,
    upto: int | None,
    before: int | None,
    limit: int,
    text_chars: int,
    max_bytes: int,
    holds: Holds,
    org_wide: bool = False,
) -> Row:
    """Returns `{as_of, event_id, items, next_before, has_more}`: at most `limit` of the viewer's
    prompts, the one with the newest event first, each with its latest job.

    Every event at or below `event_id` is final and reflected in the items (a later one may be
    too: replaying it changes nothing that will not change again). A prompt repeats on an older
    page only when it also had older events; the client keeps the first it got.

    Args:
        pool: database pool.
        caller: the viewer.
        upto: the SSE hub's cursor (every id at or below it is final); None while the hub is
            not ready, which answers no item, `event_id` None and `has_more` (ask again).
        before: the previous page's `next_before`: only events below it; None for the newest.
        limit: most prompts answered.
        text_chars: most characters of a prompt's or a response's text in an item.
        max_bytes: the texts' bytes past which the page ends (the first item always comes).
        holds: the org's limits that hold due jobs back (each item's `held`).
        org_wide: the viewer's whole org instead of the viewer's own prompts.
    """
    as_of = datetime.now(UTC)
    if upto is None:
        return {"as_of": as_of, "event_id": None, "items": [], "next_before": before,
                "has_more": True}
    start = upto + 1 if before is None else min(before, upto + 1)

    def read(conn: DictConnection) -> Row:
        walk = mission_q.MISSION_LATEST_FOR_ORG if org_wide else mission_q.MISSION_LATEST_FOR_USER
        events = conn.execute(walk, {"org_id": caller.org_id, "user_id": caller.user_id,
                                     "before": start, "upto": upto, "scan": SCAN_EVENTS}).fetchall()
        # NOTE: each prompt's newest event in the walk; dicts keep the order they were met in.
        newest: dict[uuid.UUID, int] = {}
        next_before: int | None = events[-1]["id"] if len(events) == SCAN_EVENTS else None
        for event in events:
            if event["prompt_id"] in newest:
                continue
            if len(newest) == limit:
                next_before = event["id"] + 1
                break
            newest[event["prompt_id"]] = event["id"]
        items, cut = prompts_latest(conn, caller.org_id, list(newest), text_chars=text_chars,
                                    max_bytes=max_bytes, holds=holds)
        if cut:
            next_before = newest[items[-1]["prompt_id"]]
        return {"as_of": as_of, "event_id": upto, "items": items, "next_before": next_before,
                "has_more": next_before is not None}

    # NOTE: a read: safe to run again on a fresh connection when the server ended the first.
    return reconnecting(pool, read)
