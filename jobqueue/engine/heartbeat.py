"""A worker's hold on its running jobs: heartbeat them, or release them all at shutdown."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg_pool import ConnectionPool

from jobqueue.core import wakeup
from jobqueue.core.db import DictConnection
from jobqueue.core.queries import job as q
from jobqueue.core.states import JobState
from jobqueue.engine import quarantine, transitions
from jobqueue.engine.isolation import write_isolated

__all__ = ["heartbeat", "release"]

Row = dict[str, Any]


def heartbeat(
    pool: ConnectionPool[DictConnection], worker_claim: str, jobs: Mapping[uuid.UUID, int]
) -> set[tuple[uuid.UUID, int]]:
    """Refreshes the heartbeat of the jobs still running under this claim, in one statement.

    A job whose row cannot be written is quarantined, so it cannot stop the others' heartbeats:
    the worker abandons it like a job it lost.

    Args:
        pool: database pool.
        worker_claim: this worker's claim.
        jobs: the jobs it holds, each with its org.

    Returns:
        (id, attempt) of each job still ours; a job missing was cancelled, reclaimed or finished.
    """
    def write(conn: DictConnection, part: Sequence[uuid.UUID]) -> list[Row]:
        return conn.execute(q.JOB_HEARTBEAT_MANY_IF_CLAIMED,
                            {"job_ids": list(part), "claim": worker_claim}).fetchall()

    with pool.connection() as conn:
        done = write_isolated(conn, list(jobs), write)
        for job_id, exc in done.failed:
            quarantine.set_aside(conn, job_id, jobs[job_id], "heartbeat", exc)
    return {(r["id"], r["attempt"]) for r in done.rows}


def release(pool: ConnectionPool[DictConnection], worker_claim: str) -> int:
    """Puts every job still running under this claim back in the queue, no attempt spent.

    Used at shutdown for the jobs a worker could not finish within its grace: not their fault. A
    job whose row cannot be written is quarantined; the others are released.

    Returns:
        How many jobs were released.
    """
    def write(conn: DictConnection, part: Sequence[Row]) -> list[Row]:
        return conn.execute(q.JOB_RELEASE_MANY_IF_CLAIMED, {
            "job_ids": [r["id"] for r in part], "claim": worker_claim}).fetchall()

    with pool.connection() as conn:
        held = conn.execute(q.JOB_LIST_CLAIMED, {"claim": worker_claim}).fetchall()
        done = write_isolated(conn, held, write)
        for row, exc in done.failed:
            quarantine.set_aside(conn, row["id"], row["org_id"], "release", exc)
    rows = done.rows
    if rows:
        wakeup.for_pool(pool).job_queued()
    for r in rows:
        transitions.record("job.released", JobState.RUNNING, JobState.QUEUED, level="warning",
                           job_id=str(r["id"]), prompt_id=str(r["prompt_id"]), org_id=r["org_id"],
                           attempt=r["attempt"], worker_id=worker_claim)
    return len(rows)
