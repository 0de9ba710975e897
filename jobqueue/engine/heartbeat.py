"""A worker's hold on its running jobs: heartbeat them, or release them all at shutdown."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from psycopg_pool import ConnectionPool

from jobqueue.core import wakeup
from jobqueue.core.db import DictConnection
from jobqueue.core.queries import job as q
from jobqueue.core.states import JobState
from jobqueue.engine import transitions

__all__ = ["heartbeat", "release"]


def heartbeat(
    pool: ConnectionPool[DictConnection], worker_claim: str, job_ids: Iterable[uuid.UUID]
) -> set[tuple[uuid.UUID, int]]:
    """Refreshes the heartbeat of the jobs still running under this claim, in one statement.

    Returns:
        (id, attempt) of each job still ours; a job missing was cancelled, reclaimed or finished.
    """
    with pool.connection() as conn:
        rows = conn.execute(q.JOB_HEARTBEAT_MANY_IF_CLAIMED,
                            {"job_ids": list(job_ids), "claim": worker_claim}).fetchall()
    return {(r["id"], r["attempt"]) for r in rows}


def release(pool: ConnectionPool[DictConnection], worker_claim: str) -> int:
    """Puts every job still running under this claim back in the queue, no attempt spent.

    Used at shutdown for the jobs a worker could not finish within its grace: not their fault.

    Returns:
        How many jobs were released.
    """
    with pool.connection() as conn:
        rows = conn.execute(q.JOB_RELEASE_MANY_IF_CLAIMED, {"claim": worker_claim}).fetchall()
    if rows:
        wakeup.for_pool(pool).job_queued()
    for r in rows:
        transitions.record("job.released", JobState.RUNNING, JobState.QUEUED, level="warning",
                           job_id=str(r["id"]), prompt_id=str(r["prompt_id"]), org_id=r["org_id"],
                           attempt=r["attempt"], worker_id=worker_claim)
    return len(rows)
