"""Archive: move finished jobs, their events and ledger rows out of the hot tables, in short batches.

A prompt's jobs move together, and only once every one of them is finished and unchanged since
the cutoff (see `JOB_ARCHIVE_PICK_MANY`); queued and running jobs are never touched. Each batch is
one short transaction (pick and lock with SKIP LOCKED, then ledger, events, jobs), so no lock is
held for longer than one batch and a row that is busy elsewhere is simply passed over. Prompts,
responses, edges and audit rows stay: they are durable knowledge.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, borrow
from jobqueue.core.queries import archive as q
from jobqueue.core.queries.maintenance import MAINTENANCE_SET_STATEMENT_TIMEOUT
from jobqueue.engine.isolation import write_isolated

__all__ = ["ArchiveCounts", "ArchiveCursor", "Archiver"]

log = structlog.get_logger(__name__)

# NOTE: the keyset cursor before the first row: every (created_at, id) compares greater.
_FIRST_INSTANT = datetime.min.replace(tzinfo=UTC)
_FIRST_ID = uuid.UUID(int=0)

ArchiveCursor = tuple[datetime, uuid.UUID]
"""Where a bounded archive run stopped: the (created_at, id) of the last job it scanned."""


@dataclass(frozen=True)
class ArchiveCounts:
    """What one archive run moved (or, in a dry run, would move).

    `resume_after` is set when the run stopped at its batch bound: the next run starts there.
    """

    jobs: int = 0
    events: int = 0
    ledger: int = 0
    prompts: int = 0
    batches: int = 0
    resume_after: ArchiveCursor | None = None

    def __add__(self, other: ArchiveCounts) -> ArchiveCounts:
        return ArchiveCounts(self.jobs + other.jobs, self.events + other.events,
                             self.ledger + other.ledger, self.prompts + other.prompts,
                             self.batches + other.batches, other.resume_after)


class Archiver:
    """Walks sa_job by (created_at, id) up to a cutoff and moves whole finished prompt families.

    Works on a pool (CLI, tests) or on one connection (a maintenance runner's own). Hooks for
    tests: `on_batch` (if given) is called after every committed batch with its counts.
    """

    @dataclass(frozen=True)
    class Config:
        """How much one batch does and how long its statements may run.

        Attributes:
            batch_size: jobs scanned per batch (one transaction each); a family found in it
                moves whole, so a batch may move a few more jobs than this.
            statement_timeout: bound on each statement, in seconds, applied with SET LOCAL.
        """

        batch_size: int = 500
        statement_timeout: float = 30.0

        def __post_init__(self) -> None:
            if self.batch_size <= 0:
                raise ValueError(f"batch_size must be positive, got {self.batch_size!r}")
            if not (math.isfinite(self.statement_timeout) and self.statement_timeout > 0):
                raise ValueError("statement_timeout must be a positive number of seconds, "
                                 f"got {self.statement_timeout!r}")

    def __init__(
        self,
        db: ConnectionPool[DictConnection] | DictConnection,
        config: Archiver.Config | None = None,
        *,
        on_batch: Callable[[ArchiveCounts], None] | None = None,
    ) -> None:
        self._db = db
        self.config = config or Archiver.Config()
        self.on_batch = on_batch

    def run_once(
        self, before: datetime, *, dry_run: bool = False, max_batches: int | None = None,
        start_after: ArchiveCursor | None = None,
    ) -> ArchiveCounts:
        """Archives every finished prompt family last changed before `before`, batch by batch.

        Args:
            before: the cutoff; jobs created or changed at or after it stay.
            dry_run: count what would move, then roll each batch back; nothing changes.
            max_batches: stop after this many batches (the maintenance leader's bound, so a
                large backlog never delays its reclaim for long); None for no bound.
            start_after: resume a bounded run where it stopped (its `resume_after`).

        Returns:
            The rows moved (or that would move) and the batches run.

        Raises:
            psycopg.Error: a statement failed or timed out; batches already committed stay
                committed, and the failed one is rolled back whole.
        """
        cfg = self.config
        timeout = {"timeout_ms": str(max(1, round(cfg.statement_timeout * 1000)))}
        after = start_after or (_FIRST_INSTANT, _FIRST_ID)
        cursor: dict[str, Any] = {"after_created_at": after[0], "after_id": after[1]}
        total = ArchiveCounts()
        with borrow(self._db) as conn:
            while True:
                with conn.transaction(force_rollback=dry_run):
                    conn.execute(MAINTENANCE_SET_STATEMENT_TIMEOUT, timeout)
                    picked = conn.execute(
                        q.JOB_ARCHIVE_PICK_MANY,
                        {"before": before, "limit": cfg.batch_size, **cursor},
                    ).fetchone()
                    assert picked is not None
                    batch = self._move_families(conn, picked, dry_run)
                total += batch
                if self.on_batch is not None:
                    self.on_batch(batch)
                if picked["scanned"] < cfg.batch_size:
                    break
                cursor = {"after_created_at": picked["last_created_at"],
                          "after_id": picked["last_id"]}
                if total.batches == max_batches:
                    total = replace(total, resume_after=(cursor["after_created_at"],
                                                         cursor["after_id"]))
                    break
        if total.jobs:
            log.info("archive.finished", before=before.isoformat(), dry_run=dry_run,
                     jobs=total.jobs, events=total.events, ledger=total.ledger,
                     prompts=total.prompts, batches=total.batches)
        return total

    def _move_families(self, conn: DictConnection, picked: dict[str, Any],
                       dry_run: bool) -> ArchiveCounts:
        """Moves the batch's families together, or apart around one that cannot be moved (it stays,
        logged, and a later pass tries it again)."""
        families: dict[uuid.UUID, list[uuid.UUID]] = {}
        for job_id, prompt_id in zip(picked["job_ids"], picked["job_prompt_ids"], strict=True):
            families.setdefault(prompt_id, []).append(job_id)

        def move(c: DictConnection, part: Sequence[list[uuid.UUID]]) -> list[ArchiveCounts]:
            return [self._move(c, [j for family in part for j in family], len(part), dry_run)]

        done = write_isolated(conn, list(families.values()), move)
        for family, exc in done.failed:
            log.error("archive.family_failed", jobs=[str(j) for j in family],
                      sqlstate=exc.sqlstate, error=str(exc).strip()[:500])
        moved = sum(done.rows, ArchiveCounts())
        return replace(moved, batches=1, resume_after=None)

    @staticmethod
    def _move(
        conn: DictConnection, job_ids: list[uuid.UUID], prompts: int, dry_run: bool
    ) -> ArchiveCounts:
        """Moves (or, dry, counts) one batch's ledger rows, events and jobs, in that order."""
        if not job_ids:
            return ArchiveCounts(batches=1)
        params = {"job_ids": job_ids}
        if dry_run:
            related = conn.execute(q.JOB_ARCHIVE_COUNT_RELATED, params).fetchone()
            assert related is not None
            return ArchiveCounts(jobs=len(job_ids), events=related["events"],
                                 ledger=related["ledger"], prompts=prompts, batches=1)
        ledger = conn.execute(q.LEDGER_ARCHIVE_MANY, params).rowcount
        events = conn.execute(q.JOB_EVENT_ARCHIVE_MANY, params).rowcount
        jobs = conn.execute(q.JOB_ARCHIVE_MANY, params).rowcount
        return ArchiveCounts(jobs=jobs, events=events, ledger=ledger, prompts=prompts, batches=1)
