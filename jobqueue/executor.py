"""run_claimed: the worker's entry point for one claimed job (build context, call, decide, finalize)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

import psycopg
import structlog
from psycopg_pool import ConnectionPool

from jobqueue import finalize
from jobqueue.claim import ClaimedJob
from jobqueue.db import DictConnection
from jobqueue.policy import BackoffConfig, ErrorKind, RetryAction, decide
from jobqueue.provider import Provider, ProviderFailure

__all__ = ["Executor", "Outcome"]

# NOTE: a finalize that meets a database restart is retried briefly; past this the job stays
# running without heartbeats and the reclaimer returns it to the queue.
_FINALIZE_TRIES = 5

log = structlog.get_logger(__name__)

T = TypeVar("T")


class Outcome(StrEnum):
    """How one run of a claimed job ended, from this worker's point of view."""

    SUCCEEDED = "succeeded"
    REQUEUED = "requeued"
    FAILED = "failed"
    CLAIM_LOST = "claim_lost"
    ABANDONED = "abandoned"


@dataclass
class Executor:
    """Runs claimed jobs against the provider; shared by all of a worker's job threads."""

    pool: ConnectionPool[DictConnection]
    provider: Provider
    default_model: str
    backoff: BackoffConfig
    rng: random.Random = field(default_factory=random.Random)

    @staticmethod
    def build_messages(job: ClaimedJob) -> list[dict[str, str]]:
        """Returns the chat messages: ancestors (up to `depth`) oldest first, then the prompt."""
        return [
            {"role": "user" if entry["kind"] == "prompt" else "assistant", "content": entry["content"]}
            for entry in job.context
        ]

    def run_claimed(self, job: ClaimedJob, abandoned: threading.Event | None = None) -> Outcome:
        """Runs one claimed job to a finalize, or abandons it if the claim was lost meanwhile.

        Args:
            job: the claimed job.
            abandoned: set by the heartbeat when the job is no longer ours; its result is dropped.

        Returns:
            The outcome.
        """
        bound = log.bind(job_id=str(job.id), prompt_id=str(job.prompt_id),
                         attempt=job.attempt, worker_id=job.claim, org_id=job.org_id)
        model = str(job.options.get("model") or self.default_model)
        messages = self.build_messages(job)
        try:
            completion = self.provider.complete(model, messages)
        except ProviderFailure as failure:
            # NOTE: one event per provider call; never the prompt or the reply, only their figures.
            bound.warning("provider.request", outcome=failure.kind.value, model=model,
                          http_status=failure.http_status, latency_ms=failure.latency_ms)
            if abandoned is not None and abandoned.is_set():
                bound.info("job.abandoned", error_kind=failure.kind.value)
                return Outcome.ABANDONED
            return self._handle_failure(job, failure, model, bound)
        bound.info("provider.request", outcome="ok", model=completion.model,
                   http_status=completion.http_status, latency_ms=completion.latency_ms,
                   tokens_in=completion.tokens_in, tokens_out=completion.tokens_out)
        if abandoned is not None and abandoned.is_set():
            bound.info("job.abandoned")
            return Outcome.ABANDONED
        call = finalize.CallRecord(
            model=completion.model, latency_ms=completion.latency_ms,
            http_status=completion.http_status, tokens_in=completion.tokens_in,
            tokens_out=completion.tokens_out,
        )
        won = _with_retries(lambda: finalize.succeed(self.pool, job, completion.content, call))
        return self._report(bound, won, Outcome.SUCCEEDED, latency_ms=completion.latency_ms)

    def _handle_failure(
        self, job: ClaimedJob, failure: ProviderFailure, model: str,
        bound: structlog.typing.FilteringBoundLogger,
    ) -> Outcome:
        decision = decide(failure.kind, job.attempt, job.max_attempts, failure.retry_after,
                          self.backoff, self.rng)
        call = finalize.CallRecord(model=model, latency_ms=failure.latency_ms,
                                   http_status=failure.http_status)
        message = f"{failure.message} ({decision.reason})"
        if decision.action is RetryAction.RETRY:
            won = _with_retries(lambda: finalize.requeue(
                self.pool, job, failure.kind, message, decision.delay, call))
            return self._report(bound, won, Outcome.REQUEUED, error_kind=failure.kind.value,
                                delay=round(decision.delay, 3))
        won = _with_retries(lambda: finalize.fail(self.pool, job, failure.kind, message, call))
        return self._report(bound, won, Outcome.FAILED, error_kind=failure.kind.value)

    def fail_unexpected(self, job: ClaimedJob, exc: BaseException) -> Outcome:
        """Finalizes a job whose run raised something unforeseen, as `unknown` (retryable)."""
        bound = log.bind(job_id=str(job.id), prompt_id=str(job.prompt_id), attempt=job.attempt,
                         worker_id=job.claim, org_id=job.org_id)
        failure = ProviderFailure(ErrorKind.UNKNOWN, f"worker error: {type(exc).__name__}: {exc}")
        return self._handle_failure(job, failure, str(job.options.get("model") or
                                                      self.default_model), bound)

    @staticmethod
    def _report(
        bound: structlog.typing.FilteringBoundLogger, won: bool, outcome: Outcome,
        **fields: object,
    ) -> Outcome:
        if not won:
            bound.warning("job.claim_lost", intended=outcome.value)
            return Outcome.CLAIM_LOST
        bound.info("job.finalized", outcome=outcome.value, from_state="running",
                   to_state=_TO_STATE[outcome], **fields)
        return outcome


_TO_STATE = {Outcome.SUCCEEDED: "succeeded", Outcome.REQUEUED: "queued", Outcome.FAILED: "failed"}


def _with_retries(write: Callable[[], T]) -> T:
    for attempt in range(1, _FINALIZE_TRIES + 1):
        try:
            return write()
        except psycopg.OperationalError:
            if attempt == _FINALIZE_TRIES:
                raise
            time.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")
