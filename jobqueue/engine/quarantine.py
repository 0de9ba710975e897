"""Sets aside a job no statement can write, so the batches that would hold it go on without it."""

from __future__ import annotations

import uuid

import psycopg
import structlog

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import quarantine as q

__all__ = ["set_aside"]

log = structlog.get_logger(__name__)


def set_aside(conn: DictConnection, job_id: uuid.UUID, org_id: int, operation: str,
              error: psycopg.Error) -> None:
    """Records the job in sa_job_quarantine with the error its write met, and logs it.

    The reclaimer skips a quarantined job (JOB_LIST_RECLAIMABLE_PAGE); an operator deletes its
    row once the cause is mended (ops/README.md, "Quarantined jobs").

    Args:
        conn: where to write (autocommit, or the caller's transaction).
        job_id: the job.
        org_id: its org, so an operator sees whose it is.
        operation: the write that failed (`finalize`, `reclaim`, `reject`, `release`).
        error: what the database answered.
    """
    message = str(error).strip()[:2000]
    conn.execute(q.JOB_QUARANTINE_INSERT, {"job_id": job_id, "org_id": org_id,
                                           "operation": operation, "error": message})
    log.error("job.quarantined", job_id=str(job_id), org_id=org_id, operation=operation,
              sqlstate=error.sqlstate, error=message)
