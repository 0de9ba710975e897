"""Reclaim: running jobs whose worker stopped heartbeating, or whose attempt ran too long, leave `running`.

Read a page of candidates, let the pure policy decide (`decide_reclaim`), apply the page with one
guarded statement; SQL applies decisions, it does not make them.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core import wakeup
from jobqueue.core.db import DictConnection, borrow
from jobqueue.core.policy import ReclaimCandidate, ReclaimDecision, RetryAction, decide_reclaim
from jobqueue.core.queries import maintenance as q
from jobqueue.core.settings import Settings
from jobqueue.core.states import JobState
from jobqueue.engine import chains, quarantine, transitions
from jobqueue.engine.isolation import write_isolated

__all__ = ["ReclaimCounts", "Reclaimer"]

log = structlog.get_logger(__name__)

Row = dict[str, Any]


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
    """Applies spec §5/§8's stuck-job rules (policy.decide_reclaim) a page of `batch_size` jobs at a time.

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
        """Reclaims every stale or stuck running job, page by page, until a short page.

        Args:
            now: the instant the rules compare against; None for the database's now().
                Tests pass a later instant instead of waiting.

        Returns:
            How many jobs went back to the queue and how many failed as stuck.

        Raises:
            psycopg.Error: a statement failed or timed out; pages already done stay done.
        """
        cfg = self.config
        rules = {"stale_after": cfg.stale_after, "stuck_after": cfg.stuck_after}
        timeout = {"timeout_ms": str(max(1, round(cfg.statement_timeout * 1000)))}
        cursor: dict[str, Any] = {"after_heartbeat": None, "after_id": None}
        counts = ReclaimCounts()
        with borrow(self._db) as conn:
            while True:
                with conn.transaction():
                    conn.execute(q.MAINTENANCE_SET_STATEMENT_TIMEOUT, timeout)
                    rows = conn.execute(q.JOB_LIST_RECLAIMABLE_PAGE, {
                        "now": now, "limit": cfg.batch_size, **rules, **cursor}).fetchall()
                    counts += self._apply(conn, rows)
                if len(rows) < cfg.batch_size:
                    break
                cursor = {"after_heartbeat": rows[-1]["last_heartbeat"],
                          "after_id": rows[-1]["id"]}
        if counts.total:
            log.info("reclaim.finished", requeued=counts.requeued, failed=counts.failed)
        return counts

    def _apply(self, conn: DictConnection, rows: list[Row]) -> ReclaimCounts:
        """Decides each candidate of a page and writes the decisions in one guarded statement."""
        decided: dict[uuid.UUID, tuple[Row, ReclaimDecision]] = {}
        for row in rows:
            candidate = ReclaimCandidate(
                worker_claim=row["worker_claim"], attempt=row["attempt"],
                max_attempts=row["max_attempts"], started_at=row["started_at"],
                last_heartbeat=row["last_heartbeat"])
            decision = decide_reclaim(candidate, row["as_of"], self.config.stale_after,
                                      self.config.stuck_after)
            if decision is not None:
                decided[row["id"]] = (row, decision)
        if not decided:
            return ReclaimCounts()
        as_of = rows[0]["as_of"]

        def write(c: DictConnection, part: Sequence[tuple[Row, ReclaimDecision]]) -> list[Row]:
            # NOTE: planned for each page (prepare=False): rare, and a generic plan cached while
            # sa_job was small could walk all of its key (docs/architecture.md, "Plans that hold under load").
            return c.execute(q.JOB_RECLAIM_MANY_IF_CLAIMED_AND_STALE, {
                "job_ids": [r["id"] for r, _ in part],
                "claims": [r["worker_claim"] for r, _ in part],
                "attempts": [r["attempt"] for r, _ in part],
                "to_states": ["queued" if d.action is RetryAction.RETRY else "failed"
                              for _, d in part],
                "error_kinds": [d.kind.value for _, d in part],
                "error_messages": [d.message for _, d in part],
                "as_of": as_of,
                "stale_after": self.config.stale_after,
                "stuck_after": self.config.stuck_after,
            }, prepare=False).fetchall()

        done = write_isolated(conn, list(decided.values()), write)
        for (row, _), exc in done.failed:
            quarantine.set_aside(conn, row["id"], row["org_id"], "reclaim", exc)
        written = done.rows
        if written:
            wakeup.notify_with(conn, queued=any(out["state"] == "queued" for out in written))
        chains.settle(conn, [out["id"] for out in written if out["state"] == "failed"])
        for out in written:
            read, decision = decided[out["id"]]
            transitions.record(
                "job.reclaimed", JobState.RUNNING, JobState(out["state"]),
                error_kind=decision.kind, level="warning", job_id=str(out["id"]),
                prompt_id=str(out["prompt_id"]), org_id=out["org_id"], attempt=out["attempt"],
                max_attempts=read["max_attempts"], lost_claim=read["worker_claim"],
                started_at=read["started_at"].isoformat(),
                last_heartbeat=read["last_heartbeat"].isoformat(),
            )
        requeued = sum(1 for out in written if out["state"] == "queued")
        return ReclaimCounts(requeued=requeued, failed=len(written) - requeued)
