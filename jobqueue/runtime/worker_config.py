"""A worker's settings: how much it runs at once and how often it polls and heartbeats."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobqueue.core.budget import Budgets
from jobqueue.core.settings import DEFAULT_PRIORITY_AGING

__all__ = ["DEFAULT_CONCURRENCY", "WorkerConfig"]

# NOTE: provider calls take seconds and a job mostly waits on the network, so a process runs
# many at once. 512 calls in flight cost about 75 MiB and, at one-second answers, a third of a
# core (bench/llm_shaped.py); the provider's rate limits usually set the useful maximum.
DEFAULT_CONCURRENCY = 512


@dataclass(frozen=True)
class WorkerConfig:
    """How much a worker runs at once and how often it polls and heartbeats."""

    concurrency: int = DEFAULT_CONCURRENCY
    batch_size: int | None = None
    priority_ceiling: int = 100
    org_max_running: int = 0
    priority_aging: float = DEFAULT_PRIORITY_AGING
    # NOTE: > 0 when SA_FAIR_BY_TOKENS is on: the claim weighs the orgs' tokens in windows of it.
    token_window: float = 0.0
    poll_interval: float = 2.0
    heartbeat_interval: float = 30.0
    cancel_check_interval: float = 0.5
    shutdown_grace: float = 30.0
    budgets: Budgets = field(default_factory=Budgets)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if not 0 <= self.priority_ceiling <= 100:
            raise ValueError("priority_ceiling must be within 0..100")
        if min(self.poll_interval, self.heartbeat_interval, self.cancel_check_interval) <= 0:
            raise ValueError(
                "poll_interval, heartbeat_interval and cancel_check_interval must be positive")
        if self.org_max_running < 0:
            raise ValueError("org_max_running must not be negative (0 means no cap)")
        if self.shutdown_grace < 0:
            raise ValueError("shutdown_grace must not be negative")

    @property
    def claim_limit(self) -> int:
        """The most jobs one claim may take."""
        return self.batch_size or self.concurrency
