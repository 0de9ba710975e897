"""Which sa_job_event ids are final: the gap and horizon bookkeeping of every reader of the log.

The SSE hub (service/events/log.py) and each worker's departure watch
(jobqueue/engine/departures.py) resume from "id > last"; both take their barriers with `look`
and keep them here. The bookkeeping is free of I/O.

Ids come from a sequence when a row is written, but rows become visible when their transaction
commits, so id N+1 may be visible while N is not yet. A reader that resumes from "id > last"
could skip N for good. `EventHorizon` decides, from what the hub observed, which ids may be
handed out: an id directly after the last one delivered, or any id at or below a proven horizon.

The horizon comes from barriers. A barrier is two looks, in this order: the sequence's last
value L, THEN the transactions that hold RowExclusiveLock on sa_job_event (pg_locks). Every
inserter takes that lock before it takes its id and keeps it until it ends, so a transaction
still holding an unpublished id <= L took the lock before L was read and is among the holders.
Once a later look finds none of them holding the lock, every id <= L has committed or aborted
for good: a read started after that look sees all the committed ones, and a missing id is an
aborted one. Transactions that never write an event (an idle session that wrote elsewhere, a
reader of the log) do not hold that lock, so they never hold the horizon back.

NOTE: a transaction that PREPAREs (two-phase commit) moves its locks to a holder of another
name, so while any prepared transaction holds the lock no barrier passes (they are rare and
short; holding back is the safe side). This relies on the bigserial sequence's defaults
(INCREMENT 1, CACHE 1): ids are handed out one at a time, in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from jobqueue.core.queries import job_event as q

if TYPE_CHECKING:
    from jobqueue.core.db import DictConnection

__all__ = ["Barrier", "EventHorizon", "Observed", "look"]


@dataclass(frozen=True, slots=True)
class Barrier:
    """Every id <= last_id is final once none of `holders` holds the event table's lock."""

    last_id: int
    holders: frozenset[str]


class Observed(Enum):
    """What one look at the sequence and the lock holders changed."""

    NOTHING = "nothing"
    READY = "ready"
    RESTARTED = "restarted"


class EventHorizon:
    """The delivered cursor and the proven horizon of one reader of sa_job_event.

    `cursor` is None until the first barrier has passed; from then on every id <= cursor is
    final and has been handed out (or was before this reader started), which is what makes a
    replay of `(last_event_id, cursor]` followed by the live events exact.
    """

    def __init__(self) -> None:
        self.cursor: int | None = None
        self.horizon = 0
        self._barrier: Barrier | None = None
        self._start_at: int | None = None

    def observe(self, last_id: int, holders: frozenset[str], prepared: bool) -> Observed:
        """Takes in one barrier look: the sequence's last value, THEN the lock holders.

        Args:
            last_id: the event sequence's last value (0 before the first id).
            holders: names of the transactions holding RowExclusiveLock on the event table.
            prepared: whether any of them is a prepared (two-phase) transaction.

        Returns:
            READY when this look made the cursor known, RESTARTED when the sequence went back
            (TRUNCATE ... RESTART IDENTITY, a restored dump; the cursor restarts at 0).
        """
        result = Observed.NOTHING
        if self.cursor is not None and last_id < self.cursor:
            self.cursor = 0
            self.horizon = 0
            self._barrier = None
            result = Observed.RESTARTED
        barrier = self._barrier
        if barrier is not None and barrier.holders.isdisjoint(holders) and not prepared:
            self.horizon = max(self.horizon, barrier.last_id)
            self._barrier = None
        if not holders:
            self.horizon = max(self.horizon, last_id)
        elif self._barrier is None:
            self._barrier = Barrier(last_id, holders)
        if self.cursor is None:
            if self._start_at is None:
                self._start_at = last_id
            if self.horizon >= self._start_at:
                self.cursor = self._start_at
                result = Observed.READY
        return result

    def deliverable(self, ids: Sequence[int]) -> int:
        """How many of `ids` (ascending, all above the cursor) may be handed out now, in order.

        An id may go when it directly follows the previous one (no gap) or lies at or below the
        horizon (every id there is final, so a gap there is an aborted id).
        """
        if self.cursor is None:
            return 0
        expected = self.cursor
        count = 0
        for event_id in ids:
            if event_id != expected + 1 and event_id > self.horizon:
                break
            expected = event_id
            count += 1
        return count

    def advance(self, delivered: int) -> None:
        """Moves the cursor to the last id handed out."""
        self.cursor = delivered


def look(conn: DictConnection, horizon: EventHorizon) -> tuple[Observed, int]:
    """Takes a barrier into `horizon`: the sequence's last value, THEN the lock holders.

    NOTE: two statements, in this order (see the module docstring): in one statement Postgres
    may read them in either order.

    Returns:
        What the look changed, and the sequence's last value.
    """
    last_row = conn.execute(q.JOB_EVENT_SEQUENCE_LAST).fetchone()
    holders_row = conn.execute(q.JOB_EVENT_WRITERS_HOLDING).fetchone()
    assert last_row is not None and holders_row is not None
    observed = horizon.observe(last_row["last_id"], frozenset(holders_row["holders"]),
                               holders_row["prepared"])
    return observed, int(last_row["last_id"])
