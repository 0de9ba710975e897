"""The process's one reader of sa_job_event: pages of final events, in id order, never a gap."""

from __future__ import annotations

from dataclasses import dataclass

from jobqueue.core.db import DictConnection
from jobqueue.core.horizon import EventHorizon, Observed, look
from jobqueue.core.queries import job_event as q
from service.events.model import JobEvent

__all__ = ["EventLog", "Page"]


@dataclass(frozen=True, slots=True)
class Page:
    """Final events read by one statement; `held` when an event after them waits behind a gap."""

    events: list[JobEvent]
    more: bool
    held: bool


class EventLog:
    """Reads the log past its cursor, handing out only the ids `EventHorizon` proves final.

    Its cursor is always a point below which nothing new can appear, which makes a
    Last-Event-ID replay up to it exact and lets /mission/recent page the log up to it.
    Ordinary traffic never waits for a barrier (ids arrive contiguously); only a gap does, for
    as long as the transactions that then held a lock on sa_job_event take to end.
    """

    def __init__(self, page_size: int, text_chars: int) -> None:
        self._page_size = page_size
        self._text_chars = text_chars
        self._horizon = EventHorizon()

    @property
    def cursor(self) -> int | None:
        """The id handed out last; None until the first barrier has passed."""
        return self._horizon.cursor

    def look(self, conn: DictConnection) -> tuple[Observed, int]:
        """Takes a barrier: the sequence's last value, THEN the lock holders (two statements, in
        this order; see horizon.py). Returns what it changed and the last value read."""
        return look(conn, self._horizon)

    def next_page(self, conn: DictConnection) -> Page:
        """Reads the next page after the cursor and hands out its final events (cursor moves)."""
        after = self._horizon.cursor
        assert after is not None, "look() until the log is ready"
        rows = conn.execute(q.JOB_EVENT_LIST_AFTER,
                            {"after": after, "limit": self._page_size,
                             "text_chars": self._text_chars}).fetchall()
        count = self._horizon.deliverable([row["id"] for row in rows])
        events = [JobEvent.from_row(row) for row in rows[:count]]
        if events:
            self._horizon.advance(events[-1].id)
        held = count < len(rows)
        return Page(events, more=not held and len(rows) == self._page_size, held=held)
