"""Job states and the legal transitions between them (spec §3)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["TERMINAL", "TRANSITIONS", "JobState", "is_legal", "is_terminal"]


class JobState(StrEnum):
    """Lifecycle state of an ``sa_job`` row; values match the database text."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"


TERMINAL: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.SUPERSEDED}
)
"""States a job never leaves, except that a finished job may become superseded."""

# NOTE: This table is mirrored by the transition trigger in jobqueue/sql/migrations; a test
# compares the two, so change both together. The ``None`` source stands for row
# creation, which may only produce a queued job.
TRANSITIONS: frozenset[tuple[JobState | None, JobState]] = frozenset(
    {
        (None, JobState.QUEUED),
        (JobState.QUEUED, JobState.RUNNING),
        (JobState.QUEUED, JobState.CANCELLED),
        (JobState.RUNNING, JobState.SUCCEEDED),
        (JobState.RUNNING, JobState.QUEUED),
        (JobState.RUNNING, JobState.FAILED),
        (JobState.RUNNING, JobState.CANCELLED),
        (JobState.SUCCEEDED, JobState.SUPERSEDED),
        (JobState.FAILED, JobState.SUPERSEDED),
        (JobState.CANCELLED, JobState.SUPERSEDED),
    }
)
"""Every legal ``(from_state, to_state)`` pair; ``from_state`` is ``None`` on creation."""


def is_legal(from_state: JobState | None, to_state: JobState) -> bool:
    """Tell whether a job may move from one state to another.

    Args:
        from_state: The current state, or ``None`` when the job is being created.
        to_state: The requested new state.

    Returns:
        ``True`` if ``(from_state, to_state)`` is in :data:`TRANSITIONS`.
    """
    return (from_state, to_state) in TRANSITIONS


def is_terminal(state: JobState) -> bool:
    """Tell whether a state is terminal.

    Args:
        state: The state to test.

    Returns:
        ``True`` if ``state`` is in :data:`TERMINAL`.
    """
    return state in TERMINAL
