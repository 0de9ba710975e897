"""A reconnecting stream's replay: the caller's events it missed, read page by page."""

from __future__ import annotations

from collections.abc import Iterator

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import job_event as q
from service.events.model import JobEvent

__all__ = ["replay_events"]


def replay_events(
    pool: ConnectionPool[DictConnection],
    org_id: int,
    user_id: int | None,
    after: int,
    upto: int,
    *,
    page_size: int = 500,
    page_bytes: int = 1_048_576,
    text_chars: int = 16_384,
) -> Iterator[list[JobEvent]]:
    """Yields, page by page, the (org, user)'s events with `after < id <= upto`, in id order.

    `user_id` None means the whole org's. A page holds at most `page_size` events, and stops
    once the texts before an event pass `page_bytes` (each text cut to `text_chars`). Each page
    borrows a pooled connection only while it is read, never while the caller writes it to a
    (possibly slow) client.
    """
    query = q.JOB_EVENT_LIST_FOR_ORG_BETWEEN if user_id is None else q.JOB_EVENT_LIST_FOR_USER_BETWEEN
    while after < upto:
        with pool.connection() as conn:
            rows = conn.execute(query, {
                "org_id": org_id, "user_id": user_id, "after": after, "upto": upto,
                "limit": page_size, "max_bytes": page_bytes, "text_chars": text_chars}).fetchall()
        if not rows:
            return
        events = [JobEvent.from_row(row) for row in rows]
        yield events
        after = events[-1].id
