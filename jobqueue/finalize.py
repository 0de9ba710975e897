"""Conditional finalize: each write matches the worker's claim first and does nothing if it lost it."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from jobqueue import metrics
from jobqueue.claim import ClaimedJob
from jobqueue.db import DictConnection
from jobqueue.policy import ErrorKind
from jobqueue.queries import job as q

__all__ = ["RESPONSE_NAMESPACE", "CallRecord", "fail", "requeue", "response_id_for", "succeed"]

# NOTE: response ids derive from (prompt, job), so a duplicate finalize of the same job
# collides on sa_entity's primary key instead of creating a second response.
RESPONSE_NAMESPACE = uuid.UUID("5d0c8f3e-2a61-4c1f-9a57-9b1f0f3c7a10")


@dataclass(frozen=True)
class CallRecord:
    """What the ledger keeps about one provider call."""

    model: str
    latency_ms: int
    http_status: int | None
    tokens_in: int | None = None
    tokens_out: int | None = None


def response_id_for(job: ClaimedJob) -> uuid.UUID:
    """Returns the deterministic response entity id of a job."""
    return uuid.uuid5(RESPONSE_NAMESPACE, f"{job.prompt_id}/{job.id}")


def _params(job: ClaimedJob, call: CallRecord, outcome: str) -> dict[str, object]:
    return {
        "job_id": job.id,
        "claim": job.claim,
        "attempt": job.attempt,
        "model": call.model,
        "tokens_in": call.tokens_in,
        "tokens_out": call.tokens_out,
        "latency_ms": call.latency_ms,
        "http_status": call.http_status,
        "outcome": outcome,
    }


def _finish(
    pool: ConnectionPool[DictConnection], job: ClaimedJob, statement: str, params: dict[str, object],
    to_state: str, kind: ErrorKind | None,
) -> bool:
    with pool.connection() as conn:
        won = conn.execute(statement, params).fetchone() is not None
    if won:
        metrics.TRANSITIONS.labels(from_state="running", to_state=to_state).inc()
        metrics.RUN_SECONDS.observe(time.monotonic() - job.claimed_monotonic)
        if kind is not None:
            metrics.FAILURES.labels(error_kind=kind.value).inc()
    return won


def succeed(
    pool: ConnectionPool[DictConnection], job: ClaimedJob, content: str, call: CallRecord
) -> bool:
    """Marks the job succeeded and writes response, edge, ledger and audit rows, atomically.

    Returns:
        False when the claim was lost (nothing written).
    """
    params = _params(job, call, "succeeded")
    params.update(response_id=response_id_for(job), content=content, source_refs=Jsonb([]))
    return _finish(pool, job, q.JOB_SUCCEED_IF_CLAIMED, params, "succeeded", None)


def requeue(
    pool: ConnectionPool[DictConnection],
    job: ClaimedJob,
    kind: ErrorKind,
    message: str,
    delay: float,
    call: CallRecord,
) -> bool:
    """Puts the job back in the queue for its next attempt, `delay` seconds from now.

    Returns:
        False when the claim was lost (nothing written).
    """
    params = _params(job, call, kind.value)
    params.update(error_kind=kind.value, error_message=message, delay=delay)
    return _finish(pool, job, q.JOB_REQUEUE_IF_CLAIMED, params, "queued", kind)


def fail(
    pool: ConnectionPool[DictConnection],
    job: ClaimedJob,
    kind: ErrorKind,
    message: str,
    call: CallRecord,
) -> bool:
    """Marks the job failed (terminal).

    Returns:
        False when the claim was lost (nothing written).
    """
    params = _params(job, call, kind.value)
    params.update(error_kind=kind.value, error_message=message)
    return _finish(pool, job, q.JOB_FAIL_IF_CLAIMED, params, "failed", kind)
