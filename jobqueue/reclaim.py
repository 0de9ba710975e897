"""Reclaim: running jobs whose worker stopped heartbeating go back to the queue, or fail as stuck."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

import structlog
from psycopg_pool import ConnectionPool

from jobqueue import metrics, wakeup
from jobqueue.db import DictConnection, borrow
from jobqueue.queries import maintenance as q
from jobqueue.settings import Settings

__all__ = ["ReclaimCounts", "Reclaimer"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ReclaimCounts:
    """What one reclaim round did."""

    requeued: int = 0
    failed: int = 0

    @property
    def total(self) -> int:
        """Jobs changed in all."""
        return self.requeued + self.failed

    def __add__(self, other: ReclaimCounts) -> ReclaimCounts:
        return ReclaimCounts(self.requeued + other.requeued, self.failed + other.failed)


class Reclaimer:
    """Applies spec §5/§8's stuck-job rule set-based, one page of `batch_size` jobs at a time.

    Works on a pool (CLI, tests) or on one connection (the maintenance leader's own).
    """

    @dataclass(frozen=True)
    class Config:
        """Durations in seconds; every one must be positive and finite.

        Attributes:
            stale_after: a running job whose heartbeat is older than this lost its worker.
            stuck_after: an attempt started longer ago than this fails as `stuck`.
            batch_size: jobs changed per statement (one transaction each).
            statement_timeout: bound on each statement, applied with SET LOCAL.
        """

        stale_after: float = 300.0
        stuck_after: float = 900.0
        batch_size: int = 500
        statement_timeout: float = 30.0

        def __post_init__(self) -> None:
            for name in ("stale_after", "stuck_after", "statement_timeout"):
                value = getattr(self, name)
                if not (math.isfinite(value) and value > 0):
                    raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
            if self.batch_size <= 0:
                raise ValueError(f"batch_size must be positive, got {self.batch_size!r}")

        @classmethod
        def from_settings(cls, settings: Settings) -> Reclaimer.Config:
            """Returns the config that `SA_STALE_AFTER` and `SA_STUCK_AFTER` describe."""
            return cls(stale_after=settings.stale_after, stuck_after=settings.stuck_after)

    def __init__(
        self, db: ConnectionPool[DictConnection] | DictConnection, config: Reclaimer.Config
    ) -> None:
        self._db = db
        self.config = config

    def run_once(self, now: datetime | None = None) -> ReclaimCounts:
        """Reclaims every stale running job, page by page, until a short page.

        Args:
            now: the instant the rule compares against; None for the database's now().
                Tests pass a later instant instead of waiting.

        Returns:
            How many jobs went back to the queue and how many failed as stuck.

        Raises:
            psycopg.Error: a statement failed or timed out; pages already done stay done.
        """
        cfg = self.config
        params = {
            "now": now,
            "stale_after": cfg.stale_after,
            "stuck_after": cfg.stuck_after,
            "limit": cfg.batch_size,
        }
        timeout = {"timeout_ms": str(max(1, round(cfg.statement_timeout * 1000)))}
        counts = ReclaimCounts()
        with borrow(self._db) as conn:
            while True:
                with conn.transaction():
                    conn.execute(q.MAINTENANCE_SET_STATEMENT_TIMEOUT, timeout)
                    rows = conn.execute(q.JOB_RECLAIM_MANY_IF_STALE, params).fetchall()
                    if rows:
                        wakeup.notify_with(conn, queued=any(r["state"] == "queued" for r in rows))
                for row in rows:
                    metrics.TRANSITIONS.labels(from_state="running", to_state=row["state"]).inc()
                    metrics.FAILURES.labels(
                        error_kind="worker_crash" if row["state"] == "queued" else "stuck").inc()
                    log.warning(
                        "job.reclaimed", job_id=str(row["id"]), prompt_id=str(row["prompt_id"]),
                        org_id=row["org_id"], from_state="running", to_state=row["state"],
                        attempt=row["attempt"],
                        max_attempts=row["max_attempts"], lost_claim=row["lost_claim"],
                        last_heartbeat=row["last_heartbeat"].isoformat(),
                    )
                requeued = sum(1 for r in rows if r["state"] == "queued")
                counts += ReclaimCounts(requeued=requeued, failed=len(rows) - requeued)
                if len(rows) < cfg.batch_size:
                    break
        if counts.total:
            log.info("reclaim.finished", requeued=counts.requeued, failed=counts.failed)
        return counts
