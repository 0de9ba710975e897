"""A streamed attempt's text, written while it arrives: bounded writes, and cancel mid-stream.

PERF: deltas are not stored one by one. The pieces that arrive within `interval` are appended
to the job's one sa_job_partial row in one statement (plus a coalesced wake-up for the SSE
hubs), so a job costs at most one write per interval however fast the provider streams.
"""

from __future__ import annotations

import time

from psycopg_pool import ConnectionPool

from jobqueue.core import wakeup
from jobqueue.core.db import DictConnection
from jobqueue.core.queries import partial as q
from jobqueue.engine.claim import ClaimedJob
from jobqueue.runtime.run_control import CallAbandoned

__all__ = ["PartialWriter"]


class PartialWriter:
    """Receives a streamed attempt's pieces (`feed`, as `Provider.complete`'s on_delta)."""

    def __init__(self, pool: ConnectionPool[DictConnection], job: ClaimedJob,
                 interval: float) -> None:
        self._pool = pool
        self._job = job
        self._interval = interval
        self._pending: list[str] = []
        # NOTE: the first piece is written at once: it tells viewers the attempt (re)started.
        self._written_at = -float("inf")

    def feed(self, piece: str) -> None:
        """Keeps a piece; writes what is pending when `interval` has passed since the last write.

        Raises:
            CallAbandoned: the job is no longer running under this claim and attempt.
        """
        self._pending.append(piece)
        now = time.monotonic()
        if now - self._written_at >= self._interval:
            self._written_at = now
            self._write()

    def _write(self) -> None:
        text, self._pending = "".join(self._pending), []
        job = self._job
        with self._pool.connection() as conn:
            row = conn.execute(q.JOB_PARTIAL_APPEND_IF_CLAIMED, {
                "job_id": job.id, "claim": job.claim, "attempt": job.attempt, "text": text,
            }).fetchone()
        if row is None:
            raise CallAbandoned(f"job {job.id} is no longer running under this claim")
        wakeup.for_pool(self._pool).job_changed()
