"""A worker's presence in sa_worker: said at start and every heartbeat, withdrawn at its stop,
so operators see idle workers and every worker's slots, not only those holding jobs."""

from __future__ import annotations

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import worker as q

__all__ = ["STALE_AFTER_BEATS", "gone", "seen"]

STALE_AFTER_BEATS = 3
"""A worker silent for this many heartbeat intervals has died: it is no longer listed, and its
row is deleted when another worker starts."""


def seen(pool: ConnectionPool[DictConnection], worker_id: str, slots: int, busy: int,
         *, prune_after: float | None = None) -> None:
    """Says the worker is running with `busy` of its `slots` in use; with `prune_after` (seconds),
    also deletes the rows of workers silent that long (a start does)."""
    with pool.connection() as conn:
        conn.execute(q.WORKER_SEEN, {"id": worker_id, "slots": slots, "busy": busy})
        if prune_after is not None:
            conn.execute(q.WORKER_DELETE_STALE, {"seconds": prune_after})


def gone(pool: ConnectionPool[DictConnection], worker_id: str) -> None:
    """Withdraws the worker's row (it stops)."""
    with pool.connection() as conn:
        conn.execute(q.WORKER_DELETE, {"id": worker_id})
