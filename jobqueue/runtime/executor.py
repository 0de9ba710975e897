"""run_claimed: the worker's entry point for one claimed job (build context, call, decide, finalize)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import structlog

from jobqueue.core.policy import BackoffConfig, ErrorKind, RetryAction, decide
from jobqueue.engine import finalize
from jobqueue.engine.claim import ClaimedJob
from jobqueue.runtime.completer import Completer
from jobqueue.runtime.provider import Provider, ProviderFailure

__all__ = ["Executor", "Outcome", "RunControl"]

log = structlog.get_logger(__name__)


class Outcome(StrEnum):
    """How one run of a claimed job ended, from this worker's point of view."""

    SUCCEEDED = "succeeded"
    REQUEUED = "requeued"
    FAILED = "failed"
    CLAIM_LOST = "claim_lost"
    ABANDONED = "abandoned"


class RunControl:
    """Settles the race between a job's thread and the heartbeat that finds its claim gone.

    Once the thread starts finishing, the heartbeat can no longer abandon the job (the conditional
    finalize decides); once the heartbeat abandons it, the thread drops its result.
    `on_finishing` runs once the provider call is over and the finalize begins.
    """

    # PERF: one lock for every run of the process, held for a few bytecodes: a lock per job cost
    # about 5 % of a gevent worker's CPU at 2,048 calls in flight (creating a gevent lock is dear).
    _lock = threading.Lock()

    def __init__(self, on_finishing: Callable[[], None] | None = None) -> None:
        self._abandoned = False
        self._finishing = False
        self._on_finishing = on_finishing

    def abandon(self) -> bool:
        """Marks the job abandoned; False when its finalize has already begun."""
        with self._lock:
            if not self._finishing:
                self._abandoned = True
            return self._abandoned

    def begin_finish(self) -> bool:
        """Marks the job finishing; False when it was abandoned first."""
        with self._lock:
            if not self._abandoned:
                self._finishing = True
            finishing = self._finishing
        if finishing and self._on_finishing is not None:
            self._on_finishing()
        return finishing


@dataclass
class Executor:
    """Runs claimed jobs against the provider; shared by all of a worker's job threads."""

    completer: Completer
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

    def run_claimed(self, job: ClaimedJob, control: RunControl | None = None) -> Outcome:
        """Runs one claimed job to a finalize, or abandons it if the claim was lost meanwhile.

        Args:
            job: the claimed job.
            control: abandoned by the heartbeat when the job is no longer ours (its result is
                then dropped).

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
            if control is not None and not control.begin_finish():
                bound.info("job.abandoned", error_kind=failure.kind.value)
                return Outcome.ABANDONED
            return self._handle_failure(job, failure, model, bound)
        bound.info("provider.request", outcome="ok", model=completion.model,
                   http_status=completion.http_status, latency_ms=completion.latency_ms,
                   tokens_in=completion.tokens_in, tokens_out=completion.tokens_out)
        if control is not None and not control.begin_finish():
            bound.info("job.abandoned")
            return Outcome.ABANDONED
        call = finalize.CallRecord(
            model=completion.model, latency_ms=completion.latency_ms,
            http_status=completion.http_status, tokens_in=completion.tokens_in,
            tokens_out=completion.tokens_out,
        )
        won = self.completer.finish(finalize.succeeded(job, completion.content, call))
        return self._report(bound, won, Outcome.SUCCEEDED)

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
            won = self.completer.finish(finalize.requeued(job, failure.kind, message, decision.delay,
                                                          call))
            return self._report(bound, won, Outcome.REQUEUED)
        won = self.completer.finish(finalize.failed(job, failure.kind, message, call))
        return self._report(bound, won, Outcome.FAILED)

    def fail_unexpected(self, job: ClaimedJob, exc: BaseException) -> Outcome:
        """Finalizes a job whose run raised something unforeseen, as `unknown` (retryable)."""
        bound = log.bind(job_id=str(job.id), prompt_id=str(job.prompt_id), attempt=job.attempt,
                         worker_id=job.claim, org_id=job.org_id)
        failure = ProviderFailure(ErrorKind.UNKNOWN, f"worker error: {type(exc).__name__}: {exc}")
        return self._handle_failure(job, failure, str(job.options.get("model") or
                                                      self.default_model), bound)

    @staticmethod
    def _report(bound: structlog.typing.FilteringBoundLogger, won: bool, outcome: Outcome) -> Outcome:
        """The outcome, or CLAIM_LOST when the finalize found the job no longer ours.

        NOTE: a written finalize is logged with its transition (jobqueue/engine/transitions.py).
        """
        if not won:
            bound.warning("job.claim_lost", intended=outcome.value)
            return Outcome.CLAIM_LOST
        return outcome
