"""Failure classification, backoff and the retry-or-fail decisions (spec §5/§8), the reclaim's included."""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum

__all__ = [
    "RETRYABLE",
    "BackoffConfig",
    "ErrorKind",
    "ReclaimCandidate",
    "ReclaimDecision",
    "RetryAction",
    "RetryDecision",
    "backoff_delay",
    "classify_status",
    "decide",
    "decide_reclaim",
    "parse_retry_after",
]


class ErrorKind(StrEnum):
    """Why an attempt failed; values match the ``error_kind`` column."""

    TIMEOUT = "timeout"
    RATE_LIMIT = "rate_limit"
    PROVIDER_5XX = "provider_5xx"
    PROVIDER_4XX = "provider_4xx"
    PARSE = "parse"
    AUTH = "auth"
    WORKER_CRASH = "worker_crash"
    STUCK = "stuck"
    UNKNOWN = "unknown"
    INVALID_OPTIONS = "invalid_options"
    DEPENDENCY_FAILED = "dependency_failed"
    """The job's predecessor (`after`) failed, was cancelled or superseded: it never ran."""


RETRYABLE: frozenset[ErrorKind] = frozenset(
    {
        ErrorKind.TIMEOUT,
        ErrorKind.RATE_LIMIT,
        ErrorKind.PROVIDER_5XX,
        ErrorKind.WORKER_CRASH,
        # NOTE: Unclassified errors are retried as the spec's conservative default.
        ErrorKind.UNKNOWN,
    }
)
"""Error kinds that may be retried while the attempt budget lasts."""

# NOTE: RFC 9110 delta-seconds is digits only; we also take a decimal fraction
# because the fake provider and some proxies send "0.5". Matching by pattern
# rather than float() keeps out "-1", "1e3", "nan", "inf" and "1_000".
_DELTA_SECONDS = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")

_LOG5 = math.log(5.0)


def classify_status(status: int) -> ErrorKind:
    """Map a non-2xx provider HTTP status to an error kind.

    Args:
        status: The HTTP status code the provider answered with.

    Returns:
        ``RATE_LIMIT`` for 429, ``AUTH`` for 401 and 403, ``TIMEOUT`` for 408,
        ``PROVIDER_4XX`` for other 4xx, ``PROVIDER_5XX`` for 5xx and ``UNKNOWN``
        for anything else (1xx, 3xx, out-of-range codes).

    Raises:
        ValueError: If ``status`` is 2xx, which is not a failure.
    """
    if 200 <= status <= 299:
        raise ValueError(f"status {status} is a success, not a failure")
    if status == 429:
        return ErrorKind.RATE_LIMIT
    if status in (401, 403):
        return ErrorKind.AUTH
    if status == 408:
        # NOTE: A request timeout is transient, so it joins the retryable kinds.
        return ErrorKind.TIMEOUT
    if 400 <= status <= 499:
        return ErrorKind.PROVIDER_4XX
    if 500 <= status <= 599:
        return ErrorKind.PROVIDER_5XX
    return ErrorKind.UNKNOWN


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Read a ``Retry-After`` header as seconds from ``now``.

    Args:
        value: The raw header value, or ``None`` when the header is absent.
            Either delta-seconds (non-negative, a decimal fraction allowed) or an
            HTTP-date.
        now: The current time, timezone-aware, that an HTTP-date is measured from.

    Returns:
        The wait in seconds, ``0.0`` for a date already past, or ``None`` when
        the value is missing, unparsable, negative or not finite.

    Raises:
        ValueError: If ``now`` is naive.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if _DELTA_SECONDS.fullmatch(text):
        seconds = float(text)
        # NOTE: A long digit string overflows to inf; that is garbage, not "forever".
        return seconds if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        # NOTE: HTTP-dates are always GMT; "-0000" zones parse as naive.
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


@dataclass(frozen=True)
class BackoffConfig:
    """Backoff settings, in seconds.

    Attributes:
        base: ``SA_BACKOFF_BASE``, the unit the backoff schedule scales.
        cap: ``SA_BACKOFF_CAP``, the longest wait ever returned.
        rate_limit_min_wait: ``SA_RATE_LIMIT_MIN_WAIT``, the floor for a 429
            without ``Retry-After``.
    """

    base: float = 5.0
    cap: float = 3600.0
    rate_limit_min_wait: float = 60.0

    def __post_init__(self) -> None:
        """Reject values that would make delays zero, negative or undefined.

        Raises:
            ValueError: If ``base`` or ``cap`` is not positive, if
                ``rate_limit_min_wait`` is negative, or if any value is NaN or
                infinite.
        """
        for name in ("base", "cap", "rate_limit_min_wait"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite")
        if self.base <= 0:
            raise ValueError("base must be > 0")
        if self.cap <= 0:
            raise ValueError("cap must be > 0")
        if self.rate_limit_min_wait < 0:
            raise ValueError("rate_limit_min_wait must be >= 0")


def backoff_delay(next_attempt: int, config: BackoffConfig, rng: random.Random) -> float:
    """Compute the jittered wait before an attempt.

    Attempt 2 waits ``base + U(0, base)``, attempt 3 ``5·base + U(0, 3·base)`` and
    attempt ``n >= 4`` ``5^(n-2)·base + U(0, 0.6·5^(n-2)·base)``, never more
    than ``config.cap`` (``SA_BACKOFF_CAP``, docs/configuration.md).

    Args:
        next_attempt: The number of the attempt about to be scheduled (2 or more).
        config: Backoff settings.
        rng: Source of jitter; pass a seeded ``random.Random`` for repeatable results.

    Returns:
        The delay in seconds, between the schedule's floor and ``config.cap``.

    Raises:
        ValueError: If ``next_attempt`` is less than 2.
    """
    if next_attempt < 2:
        raise ValueError(f"next_attempt must be >= 2, got {next_attempt}")
    exponent = next_attempt - 2
    # NOTE: Compare in log space first so a huge attempt number never builds
    # 5.0**n, which would raise OverflowError long before it mattered.
    if exponent * _LOG5 + math.log(config.base) >= math.log(config.cap):
        return config.cap
    if next_attempt == 2:
        floor, spread = config.base, config.base
    elif next_attempt == 3:
        floor, spread = 5.0 * config.base, 3.0 * config.base
    else:
        floor = 5.0**exponent * config.base
        spread = 0.6 * floor
    if floor >= config.cap:
        return config.cap
    return min(config.cap, floor + rng.uniform(0.0, spread))


class RetryAction(StrEnum):
    """What to do with a job after a failed attempt."""

    RETRY = "retry"
    FAIL = "fail"


@dataclass(frozen=True)
class RetryDecision:
    """Outcome of :func:`decide`.

    Attributes:
        action: Re-queue the job or fail it.
        delay: Seconds until the job may be claimed again; ``0.0`` for ``FAIL``.
        reason: Short human text for the error message suffix and logs.
    """

    action: RetryAction
    delay: float
    reason: str


def _budget_spent(attempt: int, max_attempts: int) -> bool:
    """The one attempt-budget rule: every attempt counts, a reclaimed one included."""
    return attempt >= max_attempts


def decide(
    kind: ErrorKind,
    attempt: int,
    max_attempts: int,
    retry_after: float | None,
    config: BackoffConfig,
    rng: random.Random,
) -> RetryDecision:
    """Decide whether a failed attempt is retried, and after how long.

    Args:
        kind: Classification of the failure.
        attempt: The number of the attempt that just failed (1 or more).
        max_attempts: The job's attempt budget (1 or more).
        retry_after: Seconds from a ``Retry-After`` header, if the provider sent
            one; only used for ``RATE_LIMIT``.
        config: Backoff settings.
        rng: Source of jitter.

    Returns:
        ``FAIL`` when ``kind`` is not retryable or the budget is spent; otherwise
        ``RETRY`` with the delay before the next attempt.

    Raises:
        ValueError: If ``attempt`` or ``max_attempts`` is below 1, or
            ``retry_after`` is negative or NaN.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    if retry_after is not None and not retry_after >= 0:
        # NOTE: "not >= 0" also catches NaN, which every comparison rejects.
        raise ValueError(f"retry_after must be >= 0, got {retry_after}")

    if kind not in RETRYABLE:
        return RetryDecision(RetryAction.FAIL, 0.0, "not retryable")
    if _budget_spent(attempt, max_attempts):
        return RetryDecision(
            RetryAction.FAIL, 0.0, f"retry budget exhausted after {attempt} attempts"
        )

    next_attempt = attempt + 1
    if kind is ErrorKind.RATE_LIMIT:
        if retry_after is not None:
            delay = min(retry_after, config.cap)
        else:
            delay = min(
                config.cap,
                max(config.rate_limit_min_wait, backoff_delay(next_attempt, config, rng)),
            )
    elif kind is ErrorKind.WORKER_CRASH:
        # NOTE: The attempt did not fail on its own merits, so spec §8 re-queues at once.
        delay = 0.0
    else:
        delay = backoff_delay(next_attempt, config, rng)
    return RetryDecision(
        RetryAction.RETRY,
        delay,
        f"retrying in {delay:.1f}s (attempt {next_attempt} of {max_attempts})",
    )


@dataclass(frozen=True)
class ReclaimCandidate:
    """A running job as the reclaim read it: enough to decide, and to guard the write.

    Attributes:
        worker_claim: the worker that holds it.
        attempt: the attempt it runs (1 or more).
        max_attempts: its attempt budget.
        started_at: when this attempt started.
        last_heartbeat: its worker's last heartbeat.
    """

    worker_claim: str
    attempt: int
    max_attempts: int
    started_at: datetime
    last_heartbeat: datetime


@dataclass(frozen=True)
class ReclaimDecision:
    """Outcome of :func:`decide_reclaim` for a job that must leave `running`.

    Attributes:
        action: ``RETRY`` puts the job back in the queue at once, attempt + 1; ``FAIL`` ends it.
        kind: ``WORKER_CRASH`` for a retry, ``STUCK`` for a failure (spec §8).
        message: the job's ``error_message``.
    """

    action: RetryAction
    kind: ErrorKind
    message: str


def decide_reclaim(
    job: ReclaimCandidate, now: datetime, stale_after: float, stuck_after: float
) -> ReclaimDecision | None:
    """Decide what happens to a running job (spec §5/§8 stuck-job rules).

    An attempt that started ``stuck_after`` seconds or more ago fails as ``stuck`` whatever its
    heartbeat says: a call that never ends (a provider dripping bytes) must not hold a slot for
    ever while its worker keeps heartbeating. Otherwise a job whose heartbeat is older than
    ``stale_after`` lost its worker: it is requeued at once as ``worker_crash`` while attempts
    remain (the lost attempt counts), else it fails as ``stuck``.

    Args:
        job: the running job as read.
        now: the instant the rules compare against (timezone-aware).
        stale_after: seconds without a heartbeat after which the worker counts as lost.
        stuck_after: seconds an attempt may run at most.

    Returns:
        The decision, or None when the job is neither stale nor stuck (it keeps running).

    Raises:
        ValueError: ``now`` is naive, or the attempt numbers are below 1.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")
    if job.attempt < 1 or job.max_attempts < 1:
        raise ValueError(f"attempt and max_attempts must be >= 1, got {job.attempt}, "
                         f"{job.max_attempts}")
    running_for = (now - job.started_at).total_seconds()
    silent_for = (now - job.last_heartbeat).total_seconds()
    of = f"{job.attempt} of {job.max_attempts}"
    if running_for >= stuck_after:
        heartbeat = (f"stopped heartbeating at {job.last_heartbeat.isoformat()}"
                     if silent_for > stale_after else "still heartbeating")
        return ReclaimDecision(
            RetryAction.FAIL, ErrorKind.STUCK,
            f"stuck: attempt {of} started at {job.started_at.isoformat()}, longer ago than the "
            f"stuck limit ({stuck_after:g}s); worker {job.worker_claim} {heartbeat}")
    if silent_for <= stale_after:
        return None
    if _budget_spent(job.attempt, job.max_attempts):
        return ReclaimDecision(
            RetryAction.FAIL, ErrorKind.STUCK,
            f"stuck: worker {job.worker_claim} stopped heartbeating at "
            f"{job.last_heartbeat.isoformat()} on the last attempt ({of})")
    return ReclaimDecision(
        RetryAction.RETRY, ErrorKind.WORKER_CRASH,
        f"worker {job.worker_claim} lost the job: no heartbeat since "
        f"{job.last_heartbeat.isoformat()}; attempt {of} requeued")
