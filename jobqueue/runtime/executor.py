"""run_claimed: the worker's entry point for one claimed job (build context, call, report what it came to)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

import structlog

from jobqueue.core import metrics
from jobqueue.core.attempt import CallFailed, CallRecord, CallSucceeded, CallThrottled
from jobqueue.core.fallback import fails_over, fallback_for, route_for
from jobqueue.core.policy import BackoffConfig, ErrorKind
from jobqueue.core.pricing import call_cost
from jobqueue.core.routes import Route
from jobqueue.core.states import JobState
from jobqueue.engine.claim import SENT_OPTIONS, ClaimedJob
from jobqueue.runtime.completer import Completer
from jobqueue.runtime.gate import RouteGate
from jobqueue.runtime.provider import RoutedProviders
from jobqueue.runtime.provider_answer import ProviderFailure
from jobqueue.runtime.run_control import CallAbandoned, RunControl
from jobqueue.runtime.streaming import DeltaWriter

__all__ = ["Executor", "Outcome"]

log = structlog.get_logger(__name__)


class Outcome(StrEnum):
    """How one run of a claimed job ended, from this worker's point of view."""

    SUCCEEDED = "succeeded"
    REQUEUED = "requeued"
    FAILED = "failed"
    CLAIM_LOST = "claim_lost"
    ABANDONED = "abandoned"


_OUTCOMES = {JobState.SUCCEEDED: Outcome.SUCCEEDED, JobState.QUEUED: Outcome.REQUEUED,
             JobState.FAILED: Outcome.FAILED}


@dataclass
class Executor:
    """Runs claimed jobs against the provider; shared by all of a worker's job threads."""

    completer: Completer
    providers: RoutedProviders
    backoff: BackoffConfig
    gate: RouteGate
    throttle_max_wait: float
    deltas: DeltaWriter
    fallback_after: float = 10.0

    @staticmethod
    def build_messages(job: ClaimedJob) -> list[dict[str, str]]:
        """Returns the chat messages: the `messages` option as given (an OpenAI chat request's,
        jobqueue/core/chat.py), else the `system` option, ancestors (up to `depth`) oldest first,
        then the prompt."""
        if "messages" in job.options:
            return [dict(message) for message in job.options["messages"]]
        system = [{"role": "system", "content": job.options["system"]}] if "system" in job.options else []
        return system + [
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
        model = self._model(job)
        messages = self.build_messages(job)
        # NOTE: a fallback chosen by an earlier attempt, else `prefer_provider`, else the model's.
        route = route_for(self.providers.routes, model, current=job.route,
                          prefer=job.options.get("prefer_provider"))
        if route is None:
            # NOTE: POST /prompt refuses such a model; only a web and a worker configured with
            # different routes get here.
            unroutable = ProviderFailure(ErrorKind.INVALID_OPTIONS,
                                         f"no model route serves {model!r} on this worker")
            if not self._may_finish(control, bound):
                return Outcome.ABANDONED
            return self._handle_failure(job, unroutable, model, bound)
        provider = self.providers.providers[route.name]
        ticket = self.gate.admit(route, messages, job.options.get("max_tokens"), job.org_id)
        if ticket.wait > 0:
            if not self._may_finish(control, bound):
                return Outcome.ABANDONED
            return self._throttle(job, route, ProviderFailure(
                ErrorKind.RATE_LIMIT, f"route {route.name!r} is throttled (no call made)",
                retry_after=ticket.wait), model, bound, called=False)
        # NOTE: a streamed attempt's text shows while it arrives (GET /jobs, job.output_delta).
        stream = self.deltas.open(job, control) if route.stream else None
        try:
            try:
                completion = provider.complete(
                    model, messages, on_delta=None if stream is None else stream.feed,
                    params={name: job.options[name] for name in SENT_OPTIONS if name in job.options},
                    control=control)
            finally:
                # NOTE: before any finalize, which deletes the job's rows: a write under way
                # ends first.
                if stream is not None:
                    stream.close()
        except CallAbandoned:
            self.gate.release(ticket)
            # NOTE: whoever abandoned the run (worker.py) logged it; a stream's write finding the
            # job gone (which abandons the control, cutting the call) is logged here.
            if stream is not None and stream.lost:
                bound.info("job.abandoned", reason="lost_mid_stream", route=route.name)
            return Outcome.ABANDONED
        except ProviderFailure as failure:
            self.gate.release(ticket, failure.ratelimit)
            # NOTE: one event per provider call; never the prompt or the reply, only their figures.
            bound.warning("provider.request", outcome=failure.kind.value, model=model,
                          route=route.name, http_status=failure.http_status,
                          latency_ms=failure.latency_ms)
            if not self._may_finish(control, bound, failure.kind.value):
                return Outcome.ABANDONED
            if failure.kind is ErrorKind.RATE_LIMIT:
                return self._throttle(job, route, failure, model, bound, called=True)
            return self._handle_failure(job, failure, model, bound, route)
        bound.info("provider.request", outcome="ok", model=completion.model, route=route.name,
                   http_status=completion.http_status, latency_ms=completion.latency_ms,
                   tokens_in=completion.tokens_in, tokens_out=completion.tokens_out)
        for direction, tokens in (("in", completion.tokens_in), ("out", completion.tokens_out)):
            if tokens:
                metrics.PROVIDER_TOKENS.labels(route=route.name, direction=direction).inc(tokens)
        # NOTE: priced by the model asked for: a provider may answer with a dated variant's name.
        cost = call_cost(route.prices.for_model(model) if route.prices else None,
                         completion.tokens_in, completion.tokens_out)
        if cost:
            metrics.PROVIDER_COST.labels(route=route.name).inc(cost)
        self.gate.settle(ticket, completion.tokens_in, completion.tokens_out, completion.ratelimit)
        if not self._may_finish(control, bound):
            return Outcome.ABANDONED
        call = CallRecord(
            model=completion.model, latency_ms=completion.latency_ms,
            http_status=completion.http_status, tokens_in=completion.tokens_in,
            tokens_out=completion.tokens_out, route=route.name, cost=cost,
        )
        return self._report(bound, self.completer.finish(job, CallSucceeded(completion.content, call)))

    @staticmethod
    def _may_finish(control: RunControl | None, bound: structlog.typing.FilteringBoundLogger,
                    error_kind: str | None = None) -> bool:
        """False (and logged) when the heartbeat abandoned the job first: its result is dropped."""
        if control is None or control.begin_finish():
            return True
        bound.info("job.abandoned", error_kind=error_kind)
        return False

    def _throttle(self, job: ClaimedJob, route: Route, failure: ProviderFailure, model: str,
                  bound: structlog.typing.FilteringBoundLogger, *, called: bool) -> Outcome:
        """Puts the job back with the same attempt until its route resumes, having paused the
        route for every worker; a job throttled for longer than `throttle_max_wait` since it
        first was spends its attempts as any failure, so nothing waits for ever."""
        if job.throttled_at is not None and (
                datetime.now(UTC) - job.throttled_at).total_seconds() > self.throttle_max_wait:
            return self._handle_failure(job, failure, model, bound, route if called else None)
        if called:
            seconds = (self.backoff.rate_limit_min_wait if failure.retry_after is None
                       else failure.retry_after)
            delay = self.gate.pause(route, seconds, "429")
        else:
            delay = failure.retry_after or 0.0
        call = CallRecord(model=model, http_status=failure.http_status,
                          latency_ms=failure.latency_ms if called else None,
                          route=route.name if called else None)
        message = f"{failure.message} (route {route.name!r} paused {delay:.1f}s; attempt kept)"
        fallback = self._fallback(route, model, failure.kind, delay, bound)
        if fallback is not None:
            # NOTE: the pause is longer than SA_FALLBACK_AFTER: the fallback is called at once.
            return self._report(bound, self.completer.finish(job, CallThrottled(
                f"{message}; next attempt on route {fallback!r} at once", 0.0, call, fallback)))
        return self._report(bound, self.completer.finish(job, CallThrottled(message, delay, call)))

    def _fallback(self, route: Route, model: str, kind: ErrorKind, wait: float | None,
                  bound: structlog.typing.FilteringBoundLogger) -> str | None:
        """The fallback route the job's next attempt calls after `kind` on `route`, or None."""
        if not route.fallbacks or not fails_over(kind, wait, self.fallback_after):
            return None
        paused = [name for name in route.fallbacks if self.gate.paused_for(name) > 0]
        fallback = fallback_for(self.providers.routes, route, model, paused)
        if fallback is None:
            return None
        metrics.ROUTE_FALLBACKS.labels(route=route.name, to_route=fallback.name).inc()
        bound.info("route.fallback", route=route.name, to_route=fallback.name, error_kind=kind.value)
        return fallback.name

    def _handle_failure(
        self, job: ClaimedJob, failure: ProviderFailure, model: str,
        bound: structlog.typing.FilteringBoundLogger, route: Route | None = None,
    ) -> Outcome:
        """Hands the failure to the engine, which retries or fails it (jobqueue/engine/finalize.py);
        a failure of `route` (the route called) that fails over names its fallback."""
        call = CallRecord(model=model, latency_ms=failure.latency_ms,
                          http_status=failure.http_status,
                          route=None if route is None else route.name)
        fallback = None if route is None else self._fallback(
            route, model, failure.kind, failure.retry_after, bound)
        return self._report(bound, self.completer.finish(
            job, CallFailed(failure.kind, failure.message, call, failure.retry_after, fallback)))

    def fail_unexpected(self, job: ClaimedJob, exc: BaseException) -> Outcome:
        """Finalizes a job whose run raised something unforeseen, as `unknown` (retryable)."""
        bound = log.bind(job_id=str(job.id), prompt_id=str(job.prompt_id), attempt=job.attempt,
                         worker_id=job.claim, org_id=job.org_id)
        failure = ProviderFailure(ErrorKind.UNKNOWN, f"worker error: {type(exc).__name__}: {exc}")
        return self._handle_failure(job, failure, self._model(job), bound)

    def _model(self, job: ClaimedJob) -> str:
        return str(job.options.get("model") or self.providers.routes.default_model)

    @staticmethod
    def _report(bound: structlog.typing.FilteringBoundLogger, written: JobState | None) -> Outcome:
        """The outcome the engine wrote, or CLAIM_LOST when it found the job no longer ours.

        NOTE: a written finalize is logged with its transition (jobqueue/engine/transitions.py).
        """
        if written is None:
            bound.warning("job.claim_lost")
            return Outcome.CLAIM_LOST
        return _OUTCOMES[written]
