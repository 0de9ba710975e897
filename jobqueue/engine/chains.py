"""Chains (`after`): a finished job settles its waiting dependents; a retry re-arms the ones it ended.

Every path that ends a job (finalize, cancel, reject, reclaim) calls `settle` with the jobs it
ended, once their transition committed: a success releases each job waiting on it (one level:
those run before their own dependents may); any other end cancels the whole waiting chain below
it as `dependency_failed`. A retry re-arms, in its own transaction, what the failure ended
(`rearm`). `sweep`, run by the maintenance leader, settles what a process that died between a
job's end and its `settle` left waiting. Each is a set-based statement in
jobqueue/core/queries/chain.py; none recurses in the database (0016_engine_chains.sql says why).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core import wakeup
from jobqueue.core.db import DictConnection, borrow
from jobqueue.core.policy import ErrorKind
from jobqueue.core.queries import chain as q
from jobqueue.core.states import TERMINAL, JobState
from jobqueue.engine import transitions
from jobqueue.engine.isolation import write_isolated

__all__ = ["Settled", "rearm", "report_rearmed", "settle", "sweep"]

log = structlog.get_logger(__name__)

Row = dict[str, Any]

_FIRST = uuid.UUID(int=0)


@dataclass(frozen=True)
class Settled:
    """What settling did: dependents released (now claimable) and dependents cancelled."""

    released: int = 0
    cancelled: int = 0

    def __add__(self, other: Settled) -> Settled:
        return Settled(self.released + other.released, self.cancelled + other.cancelled)


def settle(db: ConnectionPool[DictConnection] | DictConnection,
           ended: Sequence[uuid.UUID]) -> Settled:
    """Settles the waiting dependents of jobs whose end has committed.

    Args:
        db: a pool, or the connection to run on (the leader's own).
        ended: jobs that just ended (any terminal state); jobs without dependents cost one probe.

    Returns:
        How many dependents were released and cancelled.

    Raises:
        psycopg.Error: the connection failed; a predecessor whose dependents cannot be written is
            logged and left to the leader's sweep instead.
    """
    if not ended:
        return Settled()
    ids = list(dict.fromkeys(ended))
    with borrow(db) as conn:
        released = _write(conn, q.JOB_RELEASE_DEPENDENTS_MANY, ids, "release")
        cancelled = _write(conn, q.JOB_CANCEL_DEPENDENTS_MANY, ids, "cancel")
        _wake(db, conn, released, cancelled)
    _report(released, cancelled)
    return Settled(len(released), len(cancelled))


def rearm(conn: DictConnection, old_job_id: uuid.UUID, new_job_id: uuid.UUID) -> list[Row]:
    """Re-arms the chain a retried job's end cancelled, in the caller's (the retry's) transaction.

    Each job that end cancelled as dependency_failed, down the chain, is superseded by a new job
    waiting on the new job of its predecessor.

    Returns:
        The new jobs (id, prompt_id, org_id, supersedes); the caller counts them against the
        org's queue cap and records them once its transaction commits (`report_rearmed`).
    """
    return conn.execute(q.JOB_REARM_DEPENDENTS, {"old_job_id": old_job_id,
                                                 "new_job_id": new_job_id},
                        prepare=False).fetchall()


def report_rearmed(rows: Sequence[Row], retried: uuid.UUID) -> None:
    """Records a committed re-arm: each old job superseded, each new one created waiting."""
    if not rows:
        return
    scope = {"predecessor": str(retried), "org_id": rows[0]["org_id"], "jobs": len(rows)}
    transitions.record("job.superseded", JobState.CANCELLED, JobState.SUPERSEDED,
                       count=len(rows), **scope)
    transitions.record("job.enqueued", None, JobState.QUEUED, count=len(rows), rearmed=True,
                       **scope)


def sweep(conn: DictConnection, page: int = 500) -> Settled:
    """Settles every chain left waiting on a job that already ended or no longer exists.

    Run by the maintenance leader each round: a process that died between a job's end and its
    `settle` (or an operator's SQL) leaves such chains, and only this releases or ends them.

    Returns:
        What settling those chains did.
    """
    total = Settled()
    after = _FIRST
    while True:
        rows = conn.execute(q.JOB_LIST_WAITED_ON_PAGE, {"after": after, "limit": page}).fetchall()
        ended = [r["id"] for r in rows if r["state"] in TERMINAL]
        missing = [r["id"] for r in rows if r["state"] is None]
        if missing:
            orphans = _write(conn, q.JOB_CANCEL_ORPHANED_MANY, missing, "cancel", "pred_ids")
            _report([], orphans)
            wakeup.notify_with(conn, queued=False)
            total += Settled(0, len(orphans)) + settle(conn, [r["id"] for r in orphans])
        total += settle(conn, ended)
        if len(rows) < page:
            break
        after = rows[-1]["id"]
    if total.released or total.cancelled:
        log.warning("chain.swept", released=total.released, cancelled=total.cancelled)
    return total


def _write(conn: DictConnection, statement: str, ids: list[uuid.UUID], what: str,
           key: str = "job_ids") -> list[Row]:
    """Runs one settling statement over `ids`, splitting around a predecessor it cannot write."""
    def run(c: DictConnection, part: Sequence[uuid.UUID]) -> list[Row]:
        # NOTE: planned for each call (prepare=False): rare, and a generic plan cached while
        # sa_job was small could walk all of its key (docs/architecture.md, "Plans that hold under load").
        return c.execute(statement, {key: list(part)}, prepare=False).fetchall()

    done = write_isolated(conn, ids, run)
    for job_id, exc in done.failed:
        log.error("chain.settle_failed", predecessor=str(job_id), step=what,
                  sqlstate=exc.sqlstate, error=str(exc).strip()[:500])
    return done.rows


def _wake(db: ConnectionPool[DictConnection] | DictConnection, conn: DictConnection,
          released: list[Row], cancelled: list[Row]) -> None:
    if not released and not cancelled:
        return
    if not isinstance(db, ConnectionPool):
        wakeup.notify_with(conn, queued=bool(released))
        return
    sender = wakeup.for_pool(db)
    sender.job_changed()
    for row in released:
        sender.job_queued(row["scheduled_for"].timestamp())


def _report(released: list[Row], cancelled: list[Row]) -> None:
    """One line per predecessor: chains can hold thousands of jobs."""
    for predecessor, rows in _by(released, "predecessor").items():
        log.info("job.dependents_released", predecessor=predecessor, jobs=len(rows),
                 org_id=rows[0]["org_id"])
    for root, rows in _by(cancelled, "root").items():
        transitions.record("job.dependency_failed", JobState.QUEUED, JobState.CANCELLED,
                           error_kind=ErrorKind.DEPENDENCY_FAILED, count=len(rows),
                           jobs=len(rows), predecessor=root, org_id=rows[0]["org_id"])


def _by(rows: list[Row], key: str) -> dict[str, list[Row]]:
    grouped: dict[str, list[Row]] = {}
    for row in rows:
        grouped.setdefault(str(row[key]), []).append(row)
    return grouped

