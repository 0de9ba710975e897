"""Conditional finalize: each write matches the worker's claim first and does nothing if it lost it."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from psycopg_pool import ConnectionPool

from jobqueue.core import metrics, wakeup
from jobqueue.core.db import DictConnection
from jobqueue.core.policy import ErrorKind
from jobqueue.core.queries import job as q
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
]

# NOTE: response ids derive from (prompt, job), so a duplicate finalize of the same job
# collides on sa_entity's primary key instead of creating a second response.
RESPONSE_NAMESPACE = uuid.UUID("5d0c8f3e-2a61-4c1f-9a57-9b1f0f3c7a10")

_STATEMENTS = {"succeeded": q.JOB_SUCCEED_MANY_IF_CLAIMED, "queued": q.JOB_REQUEUE_MANY_IF_CLAIMED,
               "failed": q.JOB_FAIL_MANY_IF_CLAIMED}


@dataclass(frozen=True)
class CallRecord:
    """What the ledger keeps about one provider call."""

    model: str
    latency_ms: int
    http_status: int | None
    tokens_in: int | None = None
    tokens_out: int | None = None


@dataclass(frozen=True)
class Finish:
    """One job's finalize, ready to write: its target state and its row of the batch statement."""

    job: ClaimedJob
    to_state: str
    error_kind: ErrorKind | None
    row: dict[str, object]


def response_id_for(job: ClaimedJob) -> uuid.UUID:
    """Returns the deterministic response entity id of a job."""
    return uuid.uuid5(RESPONSE_NAMESPACE, f"{job.prompt_id}/{job.id}")


def _row(job: ClaimedJob, call: CallRecord) -> dict[str, object]:
    return {"job_id": job.id, "claim": job.claim, "attempt": job.attempt, "model": call.model,
            "tokens_in": call.tokens_in, "tokens_out": call.tokens_out,
            "latency_ms": call.latency_ms, "http_status": call.http_status}


def succeeded(job: ClaimedJob, content: str, call: CallRecord) -> Finish:
    """The job succeeded: response, edge, ledger and audit rows are written with it."""
    row = _row(job, call)
    row.update(response_id=response_id_for(job), content=content)
    return Finish(job, "succeeded", None, row)


def requeued(job: ClaimedJob, kind: ErrorKind, message: str, delay: float, call: CallRecord) -> Finish:
    """The job goes back to the queue for its next attempt, `delay` seconds from the write."""
    row = _row(job, call)
    row.update(error_kind=kind.value, error_message=message, delay=delay)
    return Finish(job, "queued", kind, row)


def failed(job: ClaimedJob, kind: ErrorKind, message: str, call: CallRecord) -> Finish:
    """The job failed for good (terminal)."""
    row = _row(job, call)
    row.update(error_kind=kind.value, error_message=message)
    return Finish(job, "failed", kind, row)


def finish(pool: ConnectionPool[DictConnection], finishes: Sequence[Finish]) -> list[bool]:
    """Writes `finishes` in one transaction, one statement per target state.

    Every job of the batch is guarded on its own (id, state running, worker_claim, attempt), so
    a job whose claim was lost writes nothing while the others of its batch go through.

    Returns:
        For each finish, in order, whether it was written (False: the claim was lost).
    """
    groups = [(statement, group) for to_state, statement in _STATEMENTS.items()
              if (group := [f for f in finishes if f.to_state == to_state])]
    won: set[tuple[uuid.UUID, int]] = set()
    # PERF: one statement is atomic on its own; BEGIN and COMMIT would be two more round trips.
    with pool.connection() as conn, conn.transaction() if len(groups) > 1 else contextlib.nullcontext():
        for statement, group in groups:
            params = {name: [f.row[name] for f in group] for name in group[0].row}
            won.update((r["id"], r["attempt"]) for r in conn.execute(statement, params).fetchall())
    # NOTE: by (id, attempt): a batch may hold a stale attempt of a job next to its current one.
    results = [(f.job.id, f.job.attempt) in won for f in finishes]
    _wake(pool, finishes, results)
    now = time.monotonic()
    for f, ok in zip(finishes, results, strict=True):
        if not ok:
            continue
        metrics.TRANSITIONS.labels(from_state="running", to_state=f.to_state).inc()
        metrics.RUN_SECONDS.observe(now - f.job.claimed_monotonic)
        if f.error_kind is not None:
            metrics.FAILURES.labels(error_kind=f.error_kind.value).inc()
    return results


def _wake(pool: ConnectionPool[DictConnection], finishes: Sequence[Finish], won: list[bool]) -> None:
    """Notes the batch's wake-ups: one transition wake-up, and a requeued job's due time."""
    if not any(won):
        return
    sender = wakeup.for_pool(pool)
    sender.job_changed()
    # NOTE: taken after the commit, so never earlier than the scheduled_for the database wrote.
    after_commit = time.time()
    for f, ok in zip(finishes, won, strict=True):
        if ok and f.to_state == "queued":
            sender.job_queued(after_commit + float(f.row["delay"]))  # type: ignore[arg-type]
