"""What one attempt's provider call came to, as plain values: the runtime reports, the engine decides.

The executor (jobqueue/runtime/executor.py) builds one of these; the completer batches it; the
engine (jobqueue/engine/finalize.py) alone turns it into a transition (a failure retried or
failed, by jobqueue/core/policy.py) and writes it. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobqueue.core.policy import ErrorKind

__all__ = ["AttemptResult", "CallFailed", "CallRecord", "CallSucceeded", "CallThrottled"]


@dataclass(frozen=True)
class CallRecord:
    """What the ledger keeps about one provider call; `latency_ms` None: no call was made, and
    the ledger gets no row."""

    model: str
    latency_ms: int | None
    http_status: int | None
    tokens_in: int | None = None
    tokens_out: int | None = None
    route: str | None = None
    """The route called (None: none was)."""
    cost: float | None = None
    """USD at the route's prices (None: no price, or no tokens reported)."""


@dataclass(frozen=True)
class CallSucceeded:
    """The provider answered; `content` is its reply as received."""

    content: str
    call: CallRecord


@dataclass(frozen=True)
class CallFailed:
    """The attempt failed as `kind`; whether it is retried is the engine's decision."""

    kind: ErrorKind
    message: str
    call: CallRecord
    retry_after: float | None = None
    next_route: str | None = None
    """The fallback route the next attempt calls, when the call's route failed over."""


@dataclass(frozen=True)
class CallThrottled:
    """The route is throttled: the job waits `delay` seconds with its attempt kept."""

    message: str
    delay: float
    call: CallRecord
    next_route: str | None = None
    """The fallback route the job moves to rather than wait for its route (delay 0 then)."""


AttemptResult = CallSucceeded | CallFailed | CallThrottled
