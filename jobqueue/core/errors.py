"""Domain errors, mapped to HTTP in one place (service.app) and to exit codes in the CLI."""

__all__ = ["Conflict", "IdempotencyKeyReused", "InvalidInput", "JobQueueError", "NotFound", "OverBudget",
           "QueueFull"]


class JobQueueError(Exception):
    """Base of every error the queue raises on purpose."""

    title = "Job queue error"

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


class NotFound(JobQueueError):
    """The object does not exist in the caller's org (another org's looks exactly like this)."""

    title = "Not found"


class Conflict(JobQueueError):
    """The object's current state forbids the request (terminal job, job still active)."""

    title = "Conflict"


class InvalidInput(JobQueueError):
    """The request is well-formed but refers to something it may not (unknown parent)."""

    title = "Invalid input"


class IdempotencyKeyReused(InvalidInput):
    """An Idempotency-Key was sent again, within its lifetime, with a different request."""

    title = "Idempotency-Key reused"


class TryLater(JobQueueError):
    """Refused for now, not for good: `retry_after` seconds later the same request may pass."""

    title = "Try again later"

    def __init__(self, description: str, retry_after: int) -> None:
        super().__init__(description)
        self.retry_after = retry_after


class QueueFull(TryLater):
    """The caller's org already has as many queued jobs as its cap allows; retry later."""

    title = "Too many queued jobs"


class SignInBusy(TryLater):
    """Another sign-in with the same token is being written: sign-ins of one token take turns
    without holding a database connection while they wait."""

    title = "Sign-in under way"


class OverBudget(TryLater):
    """The caller's org has spent its budget (SA_ORG_BUDGET_DAILY/_MONTHLY) until it resets."""

    title = "Budget spent"
