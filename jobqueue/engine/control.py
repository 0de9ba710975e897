"""User and operator control of jobs: cancel an active job, retry a finished one (supersede it)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from jobqueue.core import wakeup
from jobqueue.core.db import DictConnection, reconnecting
from jobqueue.core.errors import Conflict, NotFound, QueueFull
from jobqueue.core.queries import idempotency as idempotency_q
from jobqueue.core.queries import job as q
from jobqueue.core.states import JobState
from jobqueue.core.tokens import Caller
from jobqueue.engine import chains, transitions
from jobqueue.engine.enqueue import QUEUE_FULL_RETRY_AFTER
from jobqueue.engine.isolation import is_connection_failure

__all__ = ["Retried", "cancel_job", "retry_job", "retry_prompt"]

Row = dict[str, Any]

_ACTIVE = frozenset({JobState.QUEUED, JobState.RUNNING})


@dataclass(frozen=True)
class Retried:
    """The new job a retry queued, and the job it supersedes."""

    prompt_id: uuid.UUID
    job_id: uuid.UUID
    state: str
    supersedes: uuid.UUID
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """Returns the HTTP answer's body."""
        return {"prompt_id": self.prompt_id, "job_id": self.job_id, "state": self.state,
                "supersedes": self.supersedes}


def cancel_job(
    pool: ConnectionPool[DictConnection],
    job_id: uuid.UUID,
    org_id: int | None,
    *,
    reason: str | None = None,
) -> Row:
    """Cancels a queued or running job in one statement; a running job's late result is dropped.

    The worker running it loses its claim: its heartbeat abandons the call, and its
    conditional finalize matches no row, so no response, ledger or audit row is written. Jobs
    waiting on it (`after`) are cancelled with it, down their chain, before this returns.

    Args:
        pool: database pool.
        job_id: the job.
        org_id: the caller's org; None for an operator (any org).
        reason: stored as the job's error_message.

    Returns:
        The cancelled job's row.

    Raises:
        NotFound: no such job (in the caller's org).
        Conflict: the job is already terminal, or the database refuses to write it.
    """
    if reason is None:
        reason = "cancelled by an operator" if org_id is None else "cancelled by a user"
    tries: list[int] = []

    def attempt(conn: DictConnection) -> Row | None:
        tries.append(1)
        try:
            return conn.execute(q.JOB_CANCEL_IF_ACTIVE, {"job_id": job_id, "org_id": org_id,
                                                         "reason": reason}).fetchone()
        except psycopg.Error as exc:
            if is_connection_failure(conn, exc):
                raise
            # NOTE: a row no write reaches (jobqueue/engine/quarantine.py): say why, in one line.
            raise Conflict(f"job {job_id} cannot be cancelled: the database refused the change "
                           f"({str(exc).strip()[:300]})") from None

    # NOTE: a connection the server ends under the statement is retried once; the retry finding
    # the job cancelled with this very reason means the first try committed.
    row = reconnecting(pool, attempt)
    if row is None:
        raise NotFound(f"job {job_id} not found")
    dependents = row.pop("dependents")
    changed = row.pop("changed")
    if not changed and len(tries) > 1 and row["state"] == JobState.CANCELLED \
            and row["error_message"] == reason:
        changed = True
    if not changed:
        raise Conflict(f"job {job_id} is already {row['state']}; nothing to cancel")
    wakeup.for_pool(pool).job_changed()
    if dependents:
        chains.settle(pool, [row["id"]])
    # NOTE: only a claim sets worker_claim and every way back to 'queued' clears it, so a cancelled
    # job that still has one was running.
    from_state = JobState.RUNNING if row["worker_claim"] else JobState.QUEUED
    transitions.record("job.cancelled", from_state, JobState.CANCELLED, job_id=str(row["id"]),
                       prompt_id=str(row["prompt_id"]), org_id=row["org_id"],
                       attempt=row["attempt"], worker_id=row["worker_claim"],
                       operator=org_id is None)
    return row


def retry_job(
    pool: ConnectionPool[DictConnection], job_id: uuid.UUID, org_id: int | None,
    *, max_queued: int = 0,
) -> Retried:
    """Queues a new job for a finished job's prompt and marks the old one superseded, atomically.

    The chain its end cancelled (jobs submitted `after` it) is re-armed in the same transaction:
    each of those jobs gets a new one waiting on the new job of its predecessor.

    Args:
        pool: database pool.
        job_id: the finished job to retry.
        org_id: the caller's org; None for an operator (any org).
        max_queued: the most jobs the org may have queued (SA_ORG_MAX_QUEUED; 0 for no cap):
            the new job and every re-armed one count, as submits do.

    Returns:
        The new job.

    Raises:
        NotFound: no such job (in the caller's org).
        Conflict: the job is still queued or running, or it was already superseded.
        QueueFull: the new job and its re-armed chain do not fit under `max_queued`.
    """
    return _retry(pool, q.JOB_RETRY_IF_FINISHED, {"job_id": job_id, "org_id": org_id},
                  f"job {job_id}", max_queued)


def retry_prompt(
    pool: ConnectionPool[DictConnection], prompt_id: uuid.UUID, caller: Caller,
    *, max_queued: int = 0,
) -> Retried:
    """Retries the prompt's latest job (see `retry_job`).

    Raises:
        NotFound: no such prompt in the caller's org.
        Conflict: its latest job is still queued or running, or was already superseded.
        QueueFull: the new job and its re-armed chain do not fit under `max_queued`.
    """
    return _retry(pool, q.JOB_RETRY_LATEST_FOR_PROMPT_IF_FINISHED,
                  {"prompt_id": prompt_id, "org_id": caller.org_id}, f"prompt {prompt_id}",
                  max_queued)


def _retry(
    pool: ConnectionPool[DictConnection], statement: str, params: dict[str, Any], target: str,
    max_queued: int,
) -> Retried:
    """Runs one retry statement and re-arms its chain in one transaction; `target` names what
    was asked for, in error messages."""
    superseder: uuid.UUID | None = None
    rearmed: list[Row] = []
    try:
        with pool.connection() as conn, conn.transaction():
            row = conn.execute(statement, {**params, "new_job_id": uuid.uuid4()}).fetchone()
            if row is not None and row["job_id"] is None and row["superseded_by"] is None \
                    and row["old_state"] == JobState.SUPERSEDED:
                # NOTE: superseded by a retry that committed after this statement's snapshot
                # (it waited on the row lock); a fresh statement sees the winner.
                found = conn.execute(q.JOB_GET_SUPERSEDER, {"job_id": row["old_id"]}).fetchone()
                superseder = found["id"] if found is not None else None
            if row is not None and row["job_id"] is not None:
                rearmed = chains.rearm(conn, row["old_id"], row["job_id"])
                if max_queued > 0:
                    _check_cap(conn, row["org_id"], max_queued, 1 + len(rearmed))
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.constraint_name != "sa_job_supersedes_unique":
            raise
        raise Conflict(f"{target}: the job was retried concurrently and is already superseded"
                       ) from None
    if row is None:
        raise NotFound(f"{target} not found")
    if row["job_id"] is None:
        raise Conflict(_retry_refusal(row["old_id"], JobState(row["old_state"]),
                                      row["superseded_by"] or superseder))
    wakeup.for_pool(pool).job_queued()
    _report_retry(row)
    chains.report_rearmed(rearmed, row["job_id"])
    return Retried(prompt_id=row["prompt_id"], job_id=row["job_id"], state=row["state"],
                   supersedes=row["supersedes"], created_at=row["created_at"])


def _check_cap(conn: DictConnection, org_id: int, max_queued: int, added: int) -> None:
    """Raises QueueFull (rolling the retry back) when the org is past its queue cap with `added`.

    NOTE: the org's enqueue lock is taken after the writes, so every submit that held it before
    has committed and is counted, and every later one waits for this commit: exact, as at submit.
    """
    conn.execute(idempotency_q.ORG_ENQUEUE_LOCK, {"org_id": org_id})
    row = conn.execute(q.JOB_COUNT_QUEUED_FOR_ORG_CAPPED,
                       {"org_id": org_id, "cap": max_queued + 1}).fetchone()
    if row is not None and row["queued"] > max_queued:
        raise QueueFull(
            f"this retry would put {added} job(s) back (the job and the chain waiting on it) and "
            f"take your organization past {max_queued} queued jobs (the most allowed); retry when "
            "some have started", retry_after=QUEUE_FULL_RETRY_AFTER)


def _report_retry(row: Row) -> None:
    """Records a retry's two transitions: old job -> superseded, new job created queued."""
    scope = {"prompt_id": str(row["prompt_id"]), "org_id": row["org_id"]}
    transitions.record("job.superseded", JobState(row["old_state"]), JobState.SUPERSEDED,
                       job_id=str(row["old_id"]), superseded_by=str(row["job_id"]), **scope)
    transitions.record("job.enqueued", None, JobState.QUEUED, job_id=str(row["job_id"]),
                       supersedes=str(row["old_id"]), **scope)


def _retry_refusal(job_id: uuid.UUID, state: JobState, superseded_by: uuid.UUID | None) -> str:
    if state in _ACTIVE:
        return f"job {job_id} is still {state}; cancel it first"
    if state is JobState.SUPERSEDED:
        if superseded_by is None:
            return f"job {job_id} is already superseded"
        return f"job {job_id} is already superseded by {superseded_by}"
    # NOTE: unreachable while the statement supersedes every finished state; kept explicit.
    return f"job {job_id} is {state} and cannot be retried"
