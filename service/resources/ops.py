"""/ops/: the operator view's data and actions, across orgs, for tokens with the `ops` scope.

The scope is checked in service/auth.py (SCOPED_PREFIXES) before any of these runs. The reads
are the CLI's own (`queue-metrics`, `list-jobs`, both in jobqueue/engine/inspection.py), so the
page and the CLI cannot disagree.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.states import JobState
from jobqueue.engine.bulk import log_action
from jobqueue.engine.control import cancel_job, retry_job
from jobqueue.engine.inspection import list_jobs, queue_metrics
from service.contract import read_no_body

__all__ = ["OPS_LIST_LIMIT", "OPS_WINDOW", "OpsCancel", "OpsOverview", "OpsRetry"]

OPS_WINDOW = timedelta(hours=1)
"""The window of the latency and error figures the overview shows."""

OPS_LIST_LIMIT = 50
"""Most running jobs, and most failed jobs, the overview lists (newest first)."""


class OpsOverview:
    """Queue depth by state and org, oldest queued, running jobs and their workers, failures.

    PERF: counts every hot job (JOB_COUNT_BY_ORG_STATE), as `queue-metrics` does; the page asks
    every few seconds only while an operator has it open, and `archive-old-jobs` keeps the hot
    table small.
    """

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers `{as_of, metrics, running, failures}` (metrics as `queue-metrics --json`)."""
        now = datetime.now(UTC)
        report = queue_metrics(self._pool, since=now - OPS_WINDOW)
        resp.media = {
            "as_of": now,
            "metrics": report.as_dict(),
            "running": list_jobs(self._pool, state=JobState.RUNNING, limit=OPS_LIST_LIMIT),
            "failures": list_jobs(self._pool, state=JobState.FAILED, limit=OPS_LIST_LIMIT),
        }


class OpsCancel:
    """Cancels any org's queued or running job: 200 with the job, 409 when already terminal."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_post(self, req: falcon.Request, resp: falcon.Response, job_id: uuid.UUID) -> None:
        """Answers the cancelled job; 404 for an unknown id."""
        read_no_body(req)
        caller = req.context.caller
        resp.media = cancel_job(self._pool, job_id, None, reason=(
            f"cancelled by operator user {caller.user_id} of org {caller.org_id}"))
        # NOTE: logged once the cancel has committed: the log never names a change that failed.
        log_action(self._pool, caller, "cancel", {"job_id": str(job_id)}, [job_id])


class OpsRetry:
    """Retries any org's finished job: 202 with the new job that supersedes it."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_post(self, req: falcon.Request, resp: falcon.Response, job_id: uuid.UUID) -> None:
        """Queues the new job; 409 while the job is active or already superseded, 404 unknown."""
        read_no_body(req)
        retried = retry_job(self._pool, job_id, None)
        log_action(self._pool, req.context.caller, "retry",
                   {"job_id": str(job_id), "new_job_id": str(retried.job_id)}, [job_id])
        resp.status = falcon.HTTP_202
        resp.media = retried.as_dict()
