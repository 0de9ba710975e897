"""A running batch's lifecycle steps: count the jobs that ended, feed lines in as jobs while the
org's bulk lane has room, and end what a cancel or the window's end leaves unfinished.

The bulk lane: a batch's lines wait as `pending` rows, not as queued jobs, and are fed in as
room appears: an org has at most SA_BATCH_MAX_QUEUED batch jobs queued or running at once, and,
when SA_ORG_MAX_QUEUED is set, batch jobs never take the org's queue past half of it, so a
50,000-line batch never fills the queue an interactive request needs. Fed jobs run at
SA_BATCH_PRIORITY (60-90, after interactive work) inside the org's fair share and its running cap
(the claim's, unchanged).

A step (`step`) is one transaction with the batch's row locked while the keeper's lease holds;
the two job transitions a batch makes (its lines fed in as queued jobs, its jobs cancelled) are
methods of the step, which records them, wakes workers and listeners and settles the cancelled
jobs' chains once the step has committed, as every other path that changes a job does.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from jobqueue.core import wakeup
from jobqueue.core.db import DictConnection
from jobqueue.core.queries import batch as q
from jobqueue.core.queries import idempotency as idempotency_q
from jobqueue.core.queries import job as job_q
from jobqueue.core.queries.maintenance import MAINTENANCE_SET_STATEMENT_TIMEOUT
from jobqueue.core.states import JobState
from jobqueue.engine import chains, transitions

__all__ = ["BatchStep", "FeedRules", "Progress", "step"]

Row = dict[str, Any]

_CANCEL_PAGE = 1000
_END_PAGE = 5000


@dataclass(frozen=True)
class FeedRules:
    """The bulk lane: its priority, the attempts of its jobs, and the org's room in it."""

    priority: int
    max_attempts: int
    batch_max_queued: int
    org_max_queued: int


@dataclass(frozen=True)
class Progress:
    """After a count: lines that ended now, jobs still in flight, and whether lines wait."""

    ended: int
    in_flight: int
    backlog: bool


def _room(conn: DictConnection, batch: Row, rules: FeedRules) -> int:
    """How many more jobs the org's bulk lane takes now."""
    scope = {"org_id": batch["org_id"]}
    row = conn.execute(q.BATCH_ORG_IN_FLIGHT, scope).fetchone()
    assert row is not None
    room = rules.batch_max_queued - int(row["n"])
    if rules.org_max_queued > 0 and room > 0:
        # NOTE: under the enqueue's own lock, so a POST /prompt racing the feed counts it.
        conn.execute(idempotency_q.ORG_ENQUEUE_LOCK, scope)
        conn.execute(job_q.JOB_PLAN_SETTINGS)
        share = math.ceil(rules.org_max_queued / 2)
        queued = conn.execute(q.BATCH_ORG_QUEUED, {**scope, "cap": share}).fetchone()
        assert queued is not None
        room = min(room, share - int(queued["n"]))
    return max(0, room)


@dataclass
class BatchStep:
    """One step of one batch: its connection (in the step's transaction), the locked batch row,
    and the job transitions made so far, recorded by `step` once the transaction commits."""

    conn: DictConnection
    batch: Row
    fed: int = 0
    cancelled: list[Row] = field(default_factory=list)

    def count_ended(self) -> Progress:
        """Moves the lines whose jobs ended to succeeded or failed, and the batch's counts with them."""
        row = self.conn.execute(q.BATCH_COUNT_ENDED, {"id": self.batch["id"]},
                                prepare=False).fetchone()
        assert row is not None
        return Progress(int(row["ended"]), int(row["in_flight"]), bool(row["backlog"]))

    def feed(self, rules: FeedRules) -> int:
        """created -> queued: turns the next pending lines into queued jobs, as many as the lane
        has room for (BATCH_FEED_MANY).

        A page the database refuses is split and tried again; a lone line it refuses ends invalid
        (a failed request), so one bad row never stops the batch.

        Returns:
            How many jobs were queued.
        """
        conn, batch = self.conn, self.batch
        room = _room(conn, batch, rules)
        fed = 0
        while room > 0:
            try:
                with conn.transaction():
                    row = conn.execute(q.BATCH_FEED_MANY, {
                        "id": batch["id"], "room": room, "org_id": batch["org_id"],
                        "user_id": batch["created_by"], "priority": rules.priority,
                        "max_attempts": rules.max_attempts}, prepare=False).fetchone()
            except (psycopg.DataError, psycopg.IntegrityError) as exc:
                if room > 1:
                    room //= 2
                    continue
                conn.execute(q.BATCH_REQUEST_FAIL_NEXT_PENDING, {
                    "id": batch["id"], "error": json.dumps({
                        "code": "invalid_request", "param": None,
                        "message": f"the request cannot be queued: {type(exc).__name__}"})})
                continue
            assert row is not None
            fed += int(row["fed"])
            break
        self.fed += fed
        return fed

    def cancel_jobs(self, *, states: tuple[str, ...], ends_as: str, reason: str) -> list[Row]:
        """queued or running -> cancelled: the batch's jobs in `states`, a page at most
        (BATCH_JOBS_CANCEL_MANY); their lines end as `ends_as`.

        Returns:
            The jobs cancelled, each with the state it left.
        """
        rows = self.conn.execute(q.BATCH_JOBS_CANCEL_MANY, {
            "id": self.batch["id"], "states": list(states), "ends_as": ends_as, "reason": reason,
            "limit": _CANCEL_PAGE}, prepare=False).fetchall()
        self.cancelled.extend(rows)
        return rows

    def end_pending(self, ends_as: str) -> int:
        """Ends lines never fed (a page at most) as `ends_as`; returns how many."""
        cur = self.conn.execute(q.BATCH_END_PENDING_MANY, {"id": self.batch["id"],
                                                           "ends_as": ends_as, "limit": _END_PAGE},
                                prepare=False)
        return cur.rowcount


@contextmanager
def step(pool: ConnectionPool[DictConnection], batch_id: uuid.UUID, lease: uuid.UUID, *,
         statement_timeout: float) -> Iterator[BatchStep | None]:
    """Opens one step of a leased batch: None when the lease no longer holds.

    Once the block's transaction has committed, the jobs it fed and cancelled are recorded, the
    workers and listeners woken, and the chains waiting on the cancelled jobs settled at once
    (not left to the leader's sweep). A block that raises rolls back and records nothing.

    Args:
        pool: database pool; the step takes one connection, and gives it back before settling.
        batch_id: the batch.
        lease: the keeper's lease on it (BATCH_LEASE_MANY).
        statement_timeout: bound on each statement of the step, in seconds.
    """
    timeout = {"timeout_ms": str(max(1, round(statement_timeout * 1000)))}
    with pool.connection() as conn, conn.transaction():
        conn.execute(MAINTENANCE_SET_STATEMENT_TIMEOUT, timeout)
        batch = conn.execute(q.BATCH_LOCK_IF_LEASED, {"id": batch_id, "lease": lease}).fetchone()
        current = None if batch is None else BatchStep(conn, batch)
        yield current
    if current is not None:
        _committed(pool, current)


def _committed(pool: ConnectionPool[DictConnection], current: BatchStep) -> None:
    """Records a committed step's transitions, sends its wake-ups, settles its cancelled chains."""
    if not current.fed and not current.cancelled:
        return
    batch = current.batch
    ids = {"batch_id": str(batch["id"]), "org_id": batch["org_id"]}
    sender = wakeup.for_pool(pool)
    if current.fed:
        sender.job_queued()
        transitions.record("job.enqueued", None, JobState.QUEUED, count=current.fed,
                           jobs=current.fed, user_id=batch["created_by"], **ids)
    for job in current.cancelled:
        transitions.record("job.cancelled", JobState(job["state"]), JobState.CANCELLED,
                           job_id=str(job["id"]), prompt_id=str(job["prompt_id"]), **ids)
    sender.job_changed()
    # NOTE: after the records, so a settle that fails (the leader's sweep then finishes it) loses
    # no transition of the step's own.
    chains.settle(pool, [job["id"] for job in current.cancelled])
