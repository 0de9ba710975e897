"""Which of a worker's running jobs were taken from it since its last look: the departure watch.

A cancel (API, CLI, operator SQL, a batch's), a reclaim or any UPDATE that moves a job out of
`running` leaves a row in sa_job_event (the trigger writes it for every writer). Each worker
reads the rows out of `running` since its cursor, keeps the jobs it holds, and checks those by
id, so its cost per look is the same at ten calls in flight or ten thousand.

The cursor only moves up to the horizon a barrier proved (jobqueue/core/horizon.py): an id
taken before a larger one may commit after it, and "id > last" alone would skip it for good.
The few ids above the horizon are read again at the next look, which changes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.horizon import EventHorizon, Observed, look
from jobqueue.core.queries import job as job_q
from jobqueue.core.queries import job_event as q

__all__ = ["DepartureWatch"]

# NOTE: events out of `running` read per statement; a look reads pages until a short one.
_PAGE = 1000


class DepartureWatch:
    """One worker's cursor in the event log; `departed` answers which held jobs left."""

    def __init__(self, worker_claim: str) -> None:
        self._claim = worker_claim
        self._horizon = EventHorizon()
        self._cursor: int | None = None

    @property
    def ready(self) -> bool:
        """True once the first look placed the cursor."""
        return self._cursor is not None

    def departed(self, pool: ConnectionPool[DictConnection],
                 attempt_held: Callable[[uuid.UUID], int | None]) -> dict[uuid.UUID, int]:
        """The held jobs no longer running under this worker's claim and attempt.

        The first call only places the cursor at the log's end: a job claimed after it can
        only leave `running` by a later event.

        Args:
            pool: database pool.
            attempt_held: the attempt a job's call is in flight at, None when it is not held;
                asked only about the jobs the log names, so a look costs what left `running`,
                not what is in flight.

        Returns:
            Those that were cancelled, reclaimed or otherwise taken away, each with the attempt
            it was held at.
        """
        with pool.connection() as conn:
            observed, last_id = look(conn, self._horizon)
            if self._cursor is None or observed is Observed.RESTARTED:
                self._cursor = last_id
                return {}
            # NOTE: proven before the read below began, so every id up to it is in that read.
            proven = self._horizon.horizon
            seen = self._read_between(conn, self._cursor, last_id)
            self._cursor = max(self._cursor, proven)
            held = {job_id: attempt for job_id in seen
                    if (attempt := attempt_held(job_id)) is not None}
            if not held:
                return {}
            alive = {(r["id"], r["attempt"]) for r in conn.execute(
                job_q.JOB_LIST_STILL_CLAIMED, {"job_ids": list(held), "claim": self._claim})}
        return {job_id: attempt for job_id, attempt in held.items()
                if (job_id, attempt) not in alive}

    @staticmethod
    def _read_between(conn: DictConnection, after: int, upto: int) -> set[uuid.UUID]:
        """The jobs of every event out of `running` in (after, upto], page by page; a later
        event waits for the next look."""
        seen: set[uuid.UUID] = set()
        while True:
            rows = conn.execute(q.JOB_EVENT_LIST_LEFT_RUNNING_AFTER,
                                {"after": after, "upto": upto, "limit": _PAGE}).fetchall()
            seen.update(r["job_id"] for r in rows)
            if len(rows) < _PAGE:
                return seen
            after = rows[-1]["id"]
