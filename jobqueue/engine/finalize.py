"""Conditional finalize: mixed outcomes in one claim-guarded statement; a lost claim writes nothing.

The worker hands over what its calls came to (jobqueue/core/attempt.py); `finish` decides each
job's transition (a failure retried or failed, jobqueue/core/policy.py) and writes them all.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core import metrics, wakeup
from jobqueue.core.attempt import AttemptResult, CallFailed, CallRecord, CallSucceeded
from jobqueue.core.db import DictConnection
from jobqueue.core.policy import BackoffConfig, ErrorKind, RetryAction, decide
from jobqueue.core.queries import job as q
from jobqueue.core.states import JobState
from jobqueue.engine import chains, quarantine, transitions
from jobqueue.engine.claim import ClaimedJob
from jobqueue.engine.isolation import is_connection_failure, write_isolated

__all__ = [
    "BATCH_COLUMNS",
    "RESPONSE_NAMESPACE",
    "Finish",
    "FinishRules",
    "decided",
    "failed",
    "finish",
    "requeued",
    "response_id_for",
    "succeeded",
    "throttled",
    "write",
]

log = structlog.get_logger(__name__)

# NOTE: response ids derive from (prompt, job), so a duplicate finalize of the same job
# collides on sa_entity's primary key instead of creating a second response.
RESPONSE_NAMESPACE = uuid.UUID("5d0c8f3e-2a61-4c1f-9a57-9b1f0f3c7a10")

BATCH_COLUMNS = ("job_id", "claim", "attempt", "to_state", "model", "tokens_in", "tokens_out",
                 "latency_ms", "http_status", "response_id", "content", "error_kind",
                 "error_message", "delay", "spend_attempt", "route", "cost", "next_route")
"""The parameters of JOB_SET_STATE_IF_RUNNING_MANY, one array each (a row of a batch per job)."""


@dataclass(frozen=True)
class FinishRules:
    """What decides a failed attempt's fate: the backoff settings and the jitter's source."""

    backoff: BackoffConfig
    rng: random.Random = field(default_factory=random.Random)


@dataclass(frozen=True)
class Finish:
    """One job's finalize, ready to write: its target state and its row of the batch statement."""

    job: ClaimedJob
    to_state: JobState
    error_kind: ErrorKind | None
    delay: float | None
    row: dict[str, object]


def response_id_for(job: ClaimedJob) -> uuid.UUID:
    """Returns the deterministic response entity id of a job."""
    return uuid.uuid5(RESPONSE_NAMESPACE, f"{job.prompt_id}/{job.id}")


def _finish(job: ClaimedJob, to_state: JobState, call: CallRecord, *,
            error_kind: ErrorKind | None = None, delay: float | None = None,
            spend_attempt: bool = True, **outcome: object) -> Finish:
    row: dict[str, object] = dict.fromkeys(BATCH_COLUMNS)
    row.update(job_id=job.id, claim=job.claim, attempt=job.attempt, to_state=to_state.value,
               model=call.model, tokens_in=call.tokens_in, tokens_out=call.tokens_out,
               latency_ms=call.latency_ms, http_status=call.http_status, route=call.route,
               cost=call.cost,
               error_kind=error_kind.value if error_kind else None, delay=delay,
               spend_attempt=spend_attempt, **outcome)
    return Finish(job, to_state, error_kind, delay, row)


def succeeded(job: ClaimedJob, content: str, call: CallRecord) -> Finish:
    """The job succeeded: response, edge, ledger and audit rows are written with it."""
    return _finish(job, JobState.SUCCEEDED, call, response_id=response_id_for(job), content=content)


def requeued(job: ClaimedJob, kind: ErrorKind, message: str, delay: float, call: CallRecord,
             next_route: str | None = None) -> Finish:
    """The job goes back to the queue for its next attempt, `delay` seconds from the write
    (on `next_route` when its route failed over)."""
    return _finish(job, JobState.QUEUED, call, error_kind=kind, error_message=message, delay=delay,
                   next_route=next_route)


def throttled(job: ClaimedJob, message: str, delay: float, call: CallRecord,
              next_route: str | None = None) -> Finish:
    """The job goes back to the queue with the same attempt, due when its route's pause ends
    (or at once on `next_route`): a provider's rate limit is not the job's failure."""
    return _finish(job, JobState.QUEUED, call, error_kind=ErrorKind.RATE_LIMIT,
                   error_message=message, delay=delay, spend_attempt=False,
                   next_route=next_route)


def failed(job: ClaimedJob, kind: ErrorKind, message: str, call: CallRecord) -> Finish:
    """The job failed for good (terminal)."""
    return _finish(job, JobState.FAILED, call, error_kind=kind, error_message=message)


def decided(job: ClaimedJob, result: AttemptResult, rules: FinishRules) -> Finish:
    """The transition `result` makes for `job`: a failure is retried with backoff while the
    policy allows it (spec §8), else failed; a throttled job keeps its attempt."""
    if isinstance(result, CallSucceeded):
        return succeeded(job, result.content, result.call)
    if isinstance(result, CallFailed):
        decision = decide(result.kind, job.attempt, job.max_attempts, result.retry_after,
                          rules.backoff, rules.rng)
        message = f"{result.message} ({decision.reason})"
        if decision.action is RetryAction.RETRY and result.next_route is not None:
            # NOTE: the backoff spares a struggling provider; the next attempt calls another.
            return requeued(job, result.kind, f"{message}; next attempt on route "
                            f"{result.next_route!r} at once", 0.0, result.call, result.next_route)
        if decision.action is RetryAction.RETRY:
            return requeued(job, result.kind, message, decision.delay, result.call)
        return failed(job, result.kind, message, result.call)
    return throttled(job, result.message, result.delay, result.call, result.next_route)


def finish(pool: ConnectionPool[DictConnection],
           results: Sequence[tuple[ClaimedJob, AttemptResult]],
           rules: FinishRules) -> list[JobState | None]:
    """Decides each job's transition from what its call came to, and writes them all (`write`).

    Returns:
        For each job, in order, the state written, or None when nothing was (claim lost).

    Raises:
        psycopg.Error: the connection failed (nothing of the batch was written).
    """
    finishes = [decided(job, result, rules) for job, result in results]
    return [f.to_state if ok else None
            for f, ok in zip(finishes, write(pool, finishes), strict=True)]


def write(pool: ConnectionPool[DictConnection], finishes: Sequence[Finish]) -> list[bool]:
    """Writes `finishes` in one statement (JOB_SET_STATE_IF_RUNNING_MANY), whatever their outcomes.

    Every job of the batch is guarded on its own (id, state running, worker_claim, attempt), so
    a job whose claim was lost writes nothing while the others of its batch go through. A job
    whose outcome cannot be written is failed with that error instead, or, when no write to it
    succeeds, quarantined (jobqueue/engine/quarantine.py); the rest of its batch is written. The
    waiting dependents of the jobs that ended are settled after the commit.

    Returns:
        For each finish, in order, whether its outcome was written (False: the claim was lost, or
        the outcome could not be written).

    Raises:
        psycopg.Error: the connection failed (nothing of the batch was written).
    """
    with pool.connection() as conn:
        done = write_isolated(conn, finishes, _write)
        failed = [f for f, error in done.failed if _fail_unwritable(conn, f, error)]
    # NOTE: by (id, attempt): a batch may hold a stale attempt of a job next to its current one.
    won = {(r["id"], r["attempt"]): r["dependents"] for r in done.rows}
    results = [(f.job.id, f.job.attempt) in won for f in finishes]
    _wake(pool, finishes, results)
    now = time.monotonic()
    for f, ok in zip(finishes, results, strict=True):
        if ok:
            _record(f, now)
    ended = [f.job.id for f, ok in zip(finishes, results, strict=True)
             if ok and won[(f.job.id, f.job.attempt)] and f.to_state is not JobState.QUEUED]
    _settle(pool, ended + [f.job.id for f in failed])
    return results


def _write(conn: DictConnection, finishes: Sequence[Finish]) -> list[dict[str, Any]]:
    params = {name: [f.row[name] for f in finishes] for name in BATCH_COLUMNS}
    # PERF: prepared like any statement: planning this one took 0.6 ms a batch, a quarter of its
    # execution (pg_stat_statements, docs/performance.md). Its plan stays a probe by key at any
    # table size because the statement names its keys (`id = ANY(...)`, a scalar subquery for the
    # prompt); tests/test_plans.py holds its generic plan too.
    return conn.execute(q.JOB_SET_STATE_IF_RUNNING_MANY, params).fetchall()


def _fail_unwritable(conn: DictConnection, f: Finish, error: psycopg.Error) -> bool:
    """Fails a job whose outcome the database refused, with that error; quarantines it when even
    that write fails. Returns whether it was failed (and so ended)."""
    job = f.job
    message = f"its outcome ({f.to_state}) could not be written: {str(error).strip()[:500]}"
    try:
        rows = conn.execute(q.JOB_REJECT_MANY_IF_CLAIMED, {
            "job_ids": [job.id], "attempts": [job.attempt],
            "error_kinds": [ErrorKind.UNKNOWN.value], "error_messages": [message],
            "claim": job.claim}).fetchall()
    except psycopg.Error as exc:
        if is_connection_failure(conn, exc):
            raise
        quarantine.set_aside(conn, job.id, job.org_id, "finalize", exc)
        return False
    if rows:
        transitions.record("job.unwritable", JobState.RUNNING, JobState.FAILED,
                           error_kind=ErrorKind.UNKNOWN, level="warning", job_id=str(job.id),
                           org_id=job.org_id, attempt=job.attempt, worker_id=job.claim,
                           error=message)
    return bool(rows)


def _settle(pool: ConnectionPool[DictConnection], ended: list[uuid.UUID]) -> None:
    """Settles the dependents of the jobs the batch ended; a failure is the leader's sweep's to mend.

    NOTE: the batch is committed by now, so nothing here may make the caller write it again.
    """
    if not ended:
        return
    try:
        chains.settle(pool, ended)
    except psycopg.Error as exc:
        log.warning("chain.settle_deferred", jobs=len(ended), error=str(exc).strip())


def _record(f: Finish, now: float) -> None:
    """Records one written finalize (metric and log line)."""
    metrics.RUN_SECONDS.observe(now - f.job.claimed_monotonic)
    transitions.record("job.throttled" if f.row["spend_attempt"] is False else "job.finalized",
                       JobState.RUNNING, f.to_state, error_kind=f.error_kind,
                       job_id=str(f.job.id), prompt_id=str(f.job.prompt_id), org_id=f.job.org_id,
                       attempt=f.job.attempt, worker_id=f.job.claim,
                       latency_ms=f.row["latency_ms"],
                       delay=None if f.delay is None else round(f.delay, 3))


def _wake(pool: ConnectionPool[DictConnection], finishes: Sequence[Finish], won: list[bool]) -> None:
    """Notes the batch's wake-ups: one transition wake-up, and a requeued job's due time."""
    if not any(won):
        return
    sender = wakeup.for_pool(pool)
    sender.job_changed()
    # NOTE: taken after the commit, so never earlier than the scheduled_for the database wrote.
    after_commit = time.time()
    for f, ok in zip(finishes, won, strict=True):
        if ok and f.delay is not None:
            sender.job_queued(after_commit + f.delay)
