"""The one place a committed transition is recorded: its metric and its log line."""

from __future__ import annotations

from typing import Any, Literal

import structlog

from jobqueue.core import metrics
from jobqueue.core.policy import ErrorKind
from jobqueue.core.states import TRANSITIONS, JobState

__all__ = ["record"]

log = structlog.get_logger("jobqueue.engine")

_CREATED = "none"
"""The `from_state` label of a job's creation (the database's from_state NULL)."""

# PERF: bound once per legal transition; `labels()` takes a lock and hashes its values per call.
_COUNTERS = {
    (source, target): metrics.TRANSITIONS.labels(from_state=source.value if source else _CREATED,
                                                 to_state=target.value)
    for source, target in TRANSITIONS
}

def record(
    event: str,
    from_state: JobState | None,
    to_state: JobState,
    *,
    error_kind: ErrorKind | None = None,
    count: int = 1,
    level: Literal["info", "warning"] = "info",
    **fields: Any,
) -> None:
    """Counts a transition the database has committed and writes its log line.

    Args:
        event: the log event name (`job.enqueued`, `job.claimed`, `job.finalized`, ...).
        from_state: the state left; None for a job's creation.
        to_state: the state entered.
        error_kind: the failure behind it, counted in sa_job_failures_total.
        count: how many jobs made it, for a line that speaks for several (`jobs=` in fields).
        level: `warning` for a job taken from its worker (reclaimed, released, refused), so
            operators see it.
        **fields: the line's other fields (job_id, prompt_id, org_id, attempt, ...).

    A creation (from_state None) also counts in sa_jobs_enqueued_total.

    Raises:
        ValueError: the transition is not one of spec section 3 (the database would have
            refused it, so a caller passing it has a bug).
    """
    counter = _COUNTERS.get((from_state, to_state))
    if counter is None:
        raise ValueError(f"illegal transition {from_state} -> {to_state}")
    counter.inc(count)
    if from_state is None:
        metrics.ENQUEUED.inc(count)
    if error_kind is not None:
        metrics.FAILURES.labels(error_kind=error_kind.value).inc(count)
        fields["error_kind"] = error_kind.value
    emit = log.warning if level == "warning" else log.info
    emit(event, from_state=from_state.value if from_state else None, to_state=to_state.value,
         **fields)
