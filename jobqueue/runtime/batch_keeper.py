"""The batch keeper: moves every unfinished batch along, a bounded step per batch per round.

Every long-running worker runs one. A round leases a few unfinished batches (a lease, not a
lock held across the round, so a cancel from the web never waits on a keeper), and gives each
one step in a transaction of its own that starts by locking the batch's row while its lease
holds: validate a slice of the input, count the jobs that ended and feed lines in as the bulk
lane has room, cancel what a cancel or the window's end leaves, or write a slice of the output
files. Several keepers share the work; one batch is only ever in one keeper's hands.
"""

from __future__ import annotations

import math
import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.queries import batch as q
from jobqueue.core.settings import Settings
from jobqueue.engine import batch_progress
from jobqueue.engine.batch_lines import LineRules, validate_slice
from jobqueue.engine.batch_output import write_slice
from jobqueue.engine.batch_progress import BatchStep, FeedRules

__all__ = ["BatchCounts", "BatchKeeper"]

log = structlog.get_logger(__name__)

Row = dict[str, Any]

_ENDS = {"expired": ("queued", "running"), "cancelled": ("queued",)}
"""What each ending cancels: the window's end every unfinished job; a cancel the queued ones
(running calls finish and are kept, as OpenAI's cancel keeps partial results)."""


@dataclass(frozen=True)
class BatchCounts:
    """What one round did; `more` when some batch has work left right now."""

    batches: int = 0
    lines: int = 0
    fed: int = 0
    ended: int = 0
    cancelled: int = 0
    finished: int = 0
    errors: int = 0
    more: bool = False


@dataclass
class _Step:
    fed: int = 0
    lines: int = 0
    ended: int = 0
    cancelled: list[Row] = field(default_factory=list)
    status: str | None = None
    more: bool = False


class BatchKeeper:
    """Runs batch rounds in a thread (or `run_once` from a test)."""

    @dataclass(frozen=True)
    class Config:
        """How often and how much.

        Attributes:
            interval: pause between rounds with nothing left to do now (SA_BATCH_INTERVAL).
            feed: the bulk lane (SA_BATCH_PRIORITY, SA_BATCH_MAX_QUEUED, SA_ORG_MAX_QUEUED).
            lines: how lines are judged (SA_MAX_PROMPT_CHARS, SA_MAX_BODY_BYTES, the routes).
            file_ttl: seconds an output file lives unless the batch said (SA_FILE_TTL).
            lease_seconds: how long a leased batch is the keeper's; every step is far shorter.
            batches_per_round: batches leased per round.
            slice_lines: most input lines validated, or output lines written, per step.
            slice_bytes: most input bytes validated per step.
            statement_timeout: bound on each statement of a step (SET LOCAL).
            jitter: each pause varies by up to this fraction either way.
        """

        interval: float
        feed: FeedRules
        lines: LineRules
        file_ttl: float
        lease_seconds: float = 60.0
        batches_per_round: int = 8
        slice_lines: int = 2000
        slice_bytes: int = 4 * 1024 * 1024
        statement_timeout: float = 30.0
        jitter: float = 0.1

        def __post_init__(self) -> None:
            for name in ("interval", "file_ttl", "lease_seconds", "statement_timeout"):
                value = getattr(self, name)
                if not (math.isfinite(value) and value > 0):
                    raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
            for name in ("batches_per_round", "slice_lines", "slice_bytes"):
                if getattr(self, name) < 1:
                    raise ValueError(f"{name} must be at least 1, got {getattr(self, name)!r}")
            if self.statement_timeout * 4 > self.lease_seconds:
                raise ValueError("lease_seconds must outlast a step (4 statement timeouts)")
            if not 0 <= self.jitter < 1:
                raise ValueError(f"jitter must be within [0, 1), got {self.jitter!r}")

        @classmethod
        def from_settings(cls, settings: Settings) -> BatchKeeper.Config:
            """The config the settings describe."""
            return cls(
                interval=settings.batch_interval, file_ttl=settings.file_ttl,
                statement_timeout=min(settings.statement_timeout or 30.0, 15.0),
                feed=FeedRules(priority=settings.batch_priority, max_attempts=3,
                               batch_max_queued=settings.batch_max_queued,
                               org_max_queued=settings.org_max_queued),
                lines=LineRules(max_chars=settings.max_prompt_chars,
                                max_line_bytes=settings.max_body_bytes,
                                routes=settings.routes))

    def __init__(self, pool: ConnectionPool[DictConnection], config: BatchKeeper.Config, *,
                 owns_pool: bool = False, on_round: Callable[[BatchCounts], None] | None = None,
                 rng: random.Random | None = None) -> None:
        self.pool = pool
        self.config = config
        self.on_round = on_round
        self.rounds = 0
        self.errors = 0
        self._owns_pool = owns_pool
        self._rng = rng or random.Random()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> BatchKeeper:
        """A keeper with a small pool of its own, so its steps never queue behind claims."""
        pool = open_pool(settings.worker_database_url, name="batch-keeper", max_size=2,
                         prepare=settings.prepared_statements)
        return cls(pool, cls.Config.from_settings(settings), owns_pool=True)

    def start(self) -> BatchKeeper:
        """Starts the keeper's thread; returns self."""
        if self._thread is not None:
            raise RuntimeError("batch keeper already started")
        self._thread = threading.Thread(target=self._run, name="sa-batch-keeper", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stops after the step in progress (bounded by its statement timeouts)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._owns_pool:
            self.pool.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                counts = self.run_once()
                pause = 0.0 if counts.more else self.config.interval
            except Exception:
                # NOTE: the database is down or a statement timed out: try again later.
                self.errors += 1
                log.exception("batch_keeper.round_failed")
                pause = self.config.interval
            spread = self.config.jitter
            self._wake.wait(pause * (1.0 + self._rng.uniform(-spread, spread)))

    def run_once(self) -> BatchCounts:
        """Leases unfinished batches, gives each one step, and lets them go."""
        lease = uuid.uuid4()
        with self.pool.connection() as conn:
            batches = conn.execute(q.BATCH_LEASE_MANY, {
                "lease": lease, "seconds": self.config.lease_seconds,
                "limit": self.config.batches_per_round}).fetchall()
        steps: list[_Step] = []
        errors = 0
        try:
            for batch in batches:
                try:
                    step = self._step(batch["id"], lease)
                except Exception:
                    errors += 1
                    log.exception("batch_keeper.step_failed", batch_id=str(batch["id"]))
                    continue
                if step is not None:
                    self._report(batch, step)
                    steps.append(step)
        finally:
            if batches:
                with self.pool.connection() as conn:
                    conn.execute(q.BATCH_RELEASE_MANY, {"ids": [b["id"] for b in batches],
                                                        "lease": lease})
        counts = BatchCounts(
            batches=len(batches), lines=sum(s.lines for s in steps), fed=sum(s.fed for s in steps),
            ended=sum(s.ended for s in steps), cancelled=sum(len(s.cancelled) for s in steps),
            finished=sum(1 for s in steps if s.status in ("completed", "cancelled", "expired",
                                                           "failed")),
            errors=errors, more=any(s.more for s in steps) or len(batches) == self.config.batches_per_round)
        self.rounds += 1
        self.errors += errors
        if self.on_round is not None:
            self.on_round(counts)
        return counts

    def _step(self, batch_id: uuid.UUID, lease: uuid.UUID) -> _Step | None:
        # NOTE: the engine's step records the jobs fed and cancelled, and settles the cancelled
        # jobs' chains, once it has committed.
        with batch_progress.step(self.pool, batch_id, lease,
                                 statement_timeout=self.config.statement_timeout) as current:
            if current is None:
                return None
            return self._advance(current)

    def _advance(self, current: BatchStep) -> _Step:
        """One step for the batch as locked; its status says which."""
        conn, batch = current.conn, current.batch
        status, cfg = batch["status"], self.config
        step = _Step()
        if status != "finalizing" and batch["expires_at"] <= batch["db_now"]:
            return self._end(current, step, "expired")
        if status == "validating":
            read = validate_slice(conn, batch, cfg.lines, max_lines=cfg.slice_lines,
                                  max_bytes=cfg.slice_bytes)
            step.lines, step.status, step.more = read.lines, read.status, True
        elif status == "in_progress":
            progress = current.count_ended()
            step.ended = progress.ended
            if progress.backlog:
                step.fed = current.feed(cfg.feed)
            elif progress.in_flight == 0:
                conn.execute(q.BATCH_BEGIN_FINALIZING, {"id": batch["id"], "ends_as": "completed"})
                step.status, step.more = "finalizing", True
        elif status == "cancelling":
            return self._end(current, step, "cancelled")
        elif status == "finalizing":
            ttl = batch["output_ttl"] or cfg.file_ttl
            if write_slice(conn, batch, max_lines=cfg.slice_lines, ttl=ttl):
                step.status = batch["ends_as"]
            step.more = True
        return step

    def _end(self, current: BatchStep, step: _Step, ends_as: str) -> _Step:
        """Ends what a cancel or the window's end leaves unfinished; finalizes once nothing runs."""
        reason = ("its batch's completion window ended" if ends_as == "expired"
                  else "its batch was cancelled")
        step.cancelled = current.cancel_jobs(states=_ENDS[ends_as], ends_as=ends_as, reason=reason)
        ended_pending = current.end_pending(ends_as)
        progress = current.count_ended()
        step.ended = progress.ended
        if step.cancelled or ended_pending or progress.backlog:
            step.more = True
        elif progress.in_flight == 0:
            current.conn.execute(q.BATCH_BEGIN_FINALIZING, {"id": current.batch["id"],
                                                            "ends_as": ends_as})
            step.status, step.more = "finalizing", True
        return step

    def _report(self, batch: Row, step: _Step) -> None:
        """After a step committed (its job transitions recorded by the engine): its log line."""
        if step.status is not None:
            log.info("batch.status", status=step.status, batch_id=str(batch["id"]),
                     org_id=batch["org_id"])
