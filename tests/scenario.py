"""Builds jobs in chosen states without running workers, for the operator, SQL script and metrics tests."""

from __future__ import annotations

import uuid

from psycopg_pool import ConnectionPool

from jobqueue.core.attempt import CallRecord
from jobqueue.core.db import DictConnection
from jobqueue.core.policy import ErrorKind
from jobqueue.core.tokens import Caller
from jobqueue.engine import finalize
from jobqueue.engine.claim import ClaimedJob, claim
from jobqueue.engine.control import cancel_job, retry_job
from jobqueue.engine.enqueue import enqueue

__all__ = ["OK_CALL", "Scenario"]

OK_CALL = CallRecord(model="fake-model", latency_ms=12, http_status=200, tokens_in=3,
                              tokens_out=4)
_FAILED_CALL = CallRecord(model="fake-model", latency_ms=5, http_status=400)
_LIMITED_CALL = CallRecord(model="fake-model", latency_ms=7, http_status=429)

# NOTE: jobs meant to be claimed get priority 0 and are claimed at once with ceiling 0, so a
# claim never picks up another test job left queued on purpose (those get priority 50).
_CLAIMABLE = 0
_LEFT_QUEUED = 50


class Scenario:
    """Makes jobs of one org in a given state, through the same code paths as the service."""

    def __init__(self, pool: ConnectionPool[DictConnection], caller: Caller) -> None:
        self.pool = pool
        self.caller = caller

    def queued(self, text: str = "left in the queue") -> uuid.UUID:
        """A job left queued."""
        return enqueue(self.pool, self.caller, text, priority=_LEFT_QUEUED).job_id

    def _claimed(self, text: str, max_attempts: int = 3) -> ClaimedJob:
        enqueue(self.pool, self.caller, text, priority=_CLAIMABLE, max_attempts=max_attempts)
        return self._claim_next()

    def _write(self, finish: finalize.Finish) -> None:
        assert finalize.write(self.pool, [finish]) == [True]

    def _claim_next(self) -> ClaimedJob:
        (job,) = claim(self.pool, f"scenario-{uuid.uuid4().hex[:6]}", 1, _CLAIMABLE)
        return job

    def running(self, text: str = "running forever") -> uuid.UUID:
        """A job claimed by a worker that never finishes it."""
        return self._claimed(text).id

    def succeeded(self, text: str = "answered") -> uuid.UUID:
        """A job answered on its first attempt (response, edge, ledger, audit rows written)."""
        job = self._claimed(text)
        self._write(finalize.succeeded(job, f"reply to {job.id}", OK_CALL))
        return job.id

    def retried_then_succeeded(self, text: str = "rate limited once") -> uuid.UUID:
        """A job rate limited on attempt 1 (requeued at once), answered on attempt 2."""
        job = self._claimed(text)
        self._write(finalize.requeued(job, ErrorKind.RATE_LIMIT, "429", 0.0, _LIMITED_CALL))
        again = self._claim_next()
        assert again.id == job.id and again.attempt == 2
        self._write(finalize.succeeded(again, f"reply to {job.id}", OK_CALL))
        return job.id

    def failed(self, text: str = "refused", kind: ErrorKind = ErrorKind.PROVIDER_4XX) -> uuid.UUID:
        """A job failed for good on its first attempt."""
        job = self._claimed(text)
        self._write(finalize.failed(job, kind, "provider said no", _FAILED_CALL))
        return job.id

    def cancelled(self, text: str = "never mind") -> uuid.UUID:
        """A queued job cancelled by an operator."""
        job_id = enqueue(self.pool, self.caller, text, priority=_CLAIMABLE).job_id
        cancel_job(self.pool, job_id, None)
        return job_id

    def retry(self, old: uuid.UUID, *, answer: bool = True) -> uuid.UUID:
        """Retries finished job `old` (it becomes superseded); the new job is answered or left queued."""
        new = retry_job(self.pool, old, None).job_id
        if answer:
            job = self._claim_next()
            assert job.id == new
            self._write(finalize.succeeded(job, f"reply to {job.id}", OK_CALL))
        else:
            with self.pool.connection() as conn:
                conn.execute("UPDATE sa_job SET priority = %s WHERE id = %s", (_LEFT_QUEUED, new))
        return new
