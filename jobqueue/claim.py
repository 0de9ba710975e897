"""Claim: move up to N queued jobs to running for one worker, in one statement."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg_pool import ConnectionPool

from jobqueue import metrics, wakeup
from jobqueue.db import DictConnection
from jobqueue.queries import job as q

__all__ = ["DEFAULT_DEPTH", "ClaimedJob", "claim"]

# NOTE: DESIGN.md's default for the `depth` option: ancestors sent along with a prompt.
DEFAULT_DEPTH = 10


@dataclass(frozen=True)
class ClaimedJob:
    """A job this worker holds; `claim` and `attempt` together guard every later write."""

    id: uuid.UUID
    prompt_id: uuid.UUID
    org_id: int
    created_by: int
    priority: int
    attempt: int
    max_attempts: int
    options: dict[str, Any]
    supersedes: uuid.UUID | None
    created_at: datetime
    scheduled_for: datetime
    claimed_at: datetime
    claim: str
    claimed_monotonic: float
    context: list[dict[str, str]]


def claim(
    pool: ConnectionPool[DictConnection],
    worker_claim: str,
    limit: int,
    priority_ceiling: int,
    org_max_running: int = 0,
) -> list[ClaimedJob]:
    """Claims up to `limit` claimable jobs, most urgent (lowest priority number) then oldest first.

    Args:
        pool: database pool.
        worker_claim: this worker's id, written to `worker_claim`.
        limit: free slots; never claim more than can start now.
        priority_ceiling: only jobs with priority <= this.
        org_max_running: when > 0, no org gets more running jobs than this (exact across
            workers: capped claims serialize on an advisory lock).

    Returns:
        The claimed jobs in claim order.
    """
    if limit <= 0:
        return []
    params = {"claim": worker_claim, "limit": limit, "ceiling": priority_ceiling,
              "org_cap": org_max_running, "default_depth": DEFAULT_DEPTH}
    # PERF: BEGIN, the plan settings and COMMIT cost three short round trips more than the lone
    # statement; they buy a claim whose cost does not grow with the backlog (see the settings).
    with pool.connection() as conn, metrics.CLAIM_SECONDS.time(), conn.transaction():
        conn.execute(q.JOB_PLAN_SETTINGS)
        if org_max_running > 0:
            conn.execute(q.JOB_CLAIM_LOCK_ORG_CAPPED)
            rows = conn.execute(q.JOB_CLAIM_MANY_ORG_CAPPED, params).fetchall()
        else:
            rows = conn.execute(q.JOB_CLAIM_MANY, params).fetchall()
    now = time.monotonic()
    jobs = [
        ClaimedJob(
            id=r["id"], prompt_id=r["prompt_id"], org_id=r["org_id"], created_by=r["created_by"],
            priority=r["priority"], attempt=r["attempt"], max_attempts=r["max_attempts"],
            options=r["execution_options"], supersedes=r["supersedes"],
            created_at=r["created_at"], scheduled_for=r["scheduled_for"],
            claimed_at=r["claimed_at"], claim=worker_claim, claimed_monotonic=now,
            context=r["context"],
        )
        for r in rows
    ]
    if jobs:
        wakeup.for_pool(pool).job_changed()
        metrics.TRANSITIONS.labels(from_state="queued", to_state="running").inc(len(jobs))
    for job in jobs:
        metrics.WAIT_SECONDS.observe(max(0.0, (job.claimed_at - job.scheduled_for).total_seconds()))
    return jobs
