"""Conditional finalize: mixed outcomes in one claim-guarded statement; a lost claim writes nothing."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core import metrics, wakeup
from jobqueue.core.db import DictConnection
from jobqueue.core.policy import ErrorKind
from jobqueue.core.queries import job as q
from jobqueue.core.states import JobState
from jobqueue.engine import transitions
from jobqueue.engine.claim import ClaimedJob

__all__ = [
    "RESPONSE_NAMESPACE",
    "CallRecord",
    "Finish",
    "failed",
    "finish",
    "requeued",
    "response_id_for",
    "succeeded",
    "throttled",
]

log = structlog.get_logger(__name__)

# NOTE: response ids derive from (prompt, job), so a duplicate finalize of the same job
# collides on sa_entity's primary key instead of creating a second response.
RESPONSE_NAMESPACE = uuid.UUID("5d0c8f3e-2a61-4c1f-9a57-9b1f0f3c7a10")

# NOTE: the columns of JOB_SET_STATE_IF_RUNNING_MANY's batch, one array each.
_COLUMNS = ("job_id", "claim", "attempt", "to_state", "model", "tokens_in", "tokens_out",
            "latency_ms", "http_status", "response_id", "content", "error_kind", "error_message",
            "delay", "spend_attempt")


@dataclass(frozen=True)
class CallRecord:
    """What the ledger keeps about one provider call; `latency_ms` None: no call was made, and
    the ledger gets no row."""

    model: str
    latency_ms: int | None
    http_status: int | None
    tokens_in: int | None = None
    tokens_out: int | None = None


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
    row: dict[str, object] = dict.fromkeys(_COLUMNS)
    row.update(job_id=job.id, claim=job.claim, attempt=job.attempt, to_state=to_state.value,
               model=call.model, tokens_in=call.tokens_in, tokens_out=call.tokens_out,
               latency_ms=call.latency_ms, http_status=call.http_status,
               error_kind=error_kind.value if error_kind else None, delay=delay,
               spend_attempt=spend_attempt, **outcome)
    return Finish(job, to_state, error_kind, delay, row)


def succeeded(job: ClaimedJob, content: str, call: CallRecord) -> Finish:
    """The job succeeded: response, edge, ledger and audit rows are written with it."""
    return _finish(job, JobState.SUCCEEDED, call, response_id=response_id_for(job), content=content)


def requeued(job: ClaimedJob, kind: ErrorKind, message: str, delay: float, call: CallRecord) -> Finish:
    """The job goes back to the queue for its next attempt, `delay` seconds from the write."""
    return _finish(job, JobState.QUEUED, call, error_kind=kind, error_message=message, delay=delay)


def throttled(job: ClaimedJob, message: str, delay: float, call: CallRecord) -> Finish:
    """The job goes back to the queue with the same attempt, due when its route's pause ends:
    a provider's rate limit is not the job's failure."""
    return _finish(job, JobState.QUEUED, call, error_kind=ErrorKind.RATE_LIMIT,
                   error_message=message, delay=delay, spend_attempt=False)


def failed(job: ClaimedJob, kind: ErrorKind, message: str, call: CallRecord) -> Finish:
    """The job failed for good (terminal)."""
    return _finish(job, JobState.FAILED, call, error_kind=kind, error_message=message)


def finish(pool: ConnectionPool[DictConnection], finishes: Sequence[Finish]) -> list[bool]:
    """Writes `finishes` in one statement (JOB_SET_STATE_IF_RUNNING_MANY), whatever their outcomes.

    Every job of the batch is guarded on its own (id, state running, worker_claim, attempt), so
    a job whose claim was lost writes nothing while the others of its batch go through.

    Returns:
        For each finish, in order, whether it was written (False: the claim was lost).
    """
    params = {name: [f.row[name] for f in finishes] for name in _COLUMNS}
    # PERF: planned afresh for each batch (prepare=False): a plan cached while sa_job was young
    # joins the batch to a read of all of sa_job_pkey, which then grows with the table; planned
    # for its moment it probes the key once the table has grown (tests/test_plans.py). Planning
    # took 0.7 ms for a batch of 32 on the loaded machine.
    with pool.connection() as conn:
        rows = conn.execute(q.JOB_SET_STATE_IF_RUNNING_MANY, params, prepare=False).fetchall()
    # NOTE: by (id, attempt): a batch may hold a stale attempt of a job next to its current one.
    won = {(r["id"], r["attempt"]): r["dependents"] for r in rows}
    results = [(f.job.id, f.job.attempt) in won for f in finishes]
    _wake(pool, finishes, results)
    now = time.monotonic()
    for f, ok in zip(finishes, results, strict=True):
        if ok:
            _record(f, now)
            _settled(pool, f, won[(f.job.id, f.job.attempt)])
    return results


def _settled(pool: ConnectionPool[DictConnection], f: Finish, dependents: int) -> None:
    """Wakes workers for the dependents the job's success released, or records the ones its
    failure ended (trigger sa_job_settle_dependents wrote them, in the finalize statement)."""
    if not dependents:
        return
    if f.to_state is JobState.SUCCEEDED:
        wakeup.for_pool(pool).job_queued()
        log.info("job.dependents_released", job_id=str(f.job.id), jobs=dependents)
    elif f.to_state is JobState.FAILED:
        transitions.record("job.dependents_ended", JobState.QUEUED, JobState.CANCELLED,
                           error_kind=ErrorKind.DEPENDENCY_FAILED, count=dependents,
                           jobs=dependents, predecessor=str(f.job.id), org_id=f.job.org_id)


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
