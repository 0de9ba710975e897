"""Operator actions on many jobs at once, in bounded batches, each logged in sa_ops_action.

A bulk action reaches the jobs of a selection (ids) or of a filter (jobqueue/core/console.py),
at most `max_jobs` of them, `batch_size` at a time: each batch is one transaction that changes
its jobs in one statement and adds them to the action's log row, so a stopped action leaves
whole batches done and logged, never a half. Every change is the engine's: the statements are
queries/console.py's batch forms of the single-job cancel and retry.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core import wakeup
from jobqueue.core.console import BulkAction, JobFilter
from jobqueue.core.db import DictConnection
from jobqueue.core.queries import console as q
from jobqueue.core.queries import ops_action as audit_q
from jobqueue.core.states import JobState
from jobqueue.core.tokens import Caller
from jobqueue.engine import chains, transitions
from jobqueue.engine.isolation import write_isolated

__all__ = ["BulkOutcome", "log_action", "run_bulk"]

log = structlog.get_logger(__name__)

Row = dict[str, Any]


@dataclass(frozen=True)
class BulkOutcome:
    """What a bulk action did: its log row, the jobs it changed and the batches it took."""

    action_id: int
    changed: int
    batches: int
    job_ids: list[uuid.UUID]

    def as_dict(self) -> dict[str, Any]:
        """Returns the HTTP answer's body."""
        return {"action_id": self.action_id, "changed": self.changed, "batches": self.batches,
                "job_ids": self.job_ids}


def log_action(pool: ConnectionPool[DictConnection] | DictConnection, operator: Caller,
               action: str, target: dict[str, Any], job_ids: Sequence[uuid.UUID] = ()) -> int:
    """Writes one finished action to the operators' log (a single job's change, a route's).

    Args:
        pool: database pool, or the connection of the change's own transaction.
        operator: the ops token's caller.
        action: sa_ops_action_known's name of it.
        target: what it was asked for (the job id, the route and its pause).
        job_ids: the jobs it changed.

    Returns:
        The log row's id.
    """
    params = {"org_id": operator.org_id, "user_id": operator.user_id, "action": action,
              "target": json.dumps(target), "job_count": len(job_ids), "job_ids": list(job_ids),
              "batches": 1 if job_ids else 0, "finished": True}
    if isinstance(pool, ConnectionPool):
        with pool.connection() as conn:
            row = conn.execute(audit_q.OPS_ACTION_INSERT, params).fetchone()
    else:
        row = pool.execute(audit_q.OPS_ACTION_INSERT, params).fetchone()
    assert row is not None
    return int(row["id"])


def run_bulk(
    pool: ConnectionPool[DictConnection],
    action: BulkAction,
    operator: Caller,
    *,
    job_filter: JobFilter | None = None,
    ids: Sequence[uuid.UUID] = (),
    max_jobs: int,
    batch_size: int,
) -> BulkOutcome:
    """Cancels or retries the selected jobs, or those a filter reaches, a batch at a time.

    Args:
        pool: database pool.
        action: cancel (queued and running jobs) or retry (finished jobs, never superseded).
        operator: the ops token's caller, logged as the action's author.
        job_filter: the jobs meant, when no ids are given; only those the action can change are
            reached, newest first.
        ids: the jobs meant (a selection); wins over `job_filter`.
        max_jobs: the most jobs reached (the count the operator was shown).
        batch_size: the most jobs one statement (one transaction) changes.

    Returns:
        The log row's id, the jobs changed (a job that changed state since it was listed is
        left alone, and not counted) and the batches committed.
    """
    target: dict[str, Any] = {"max_jobs": max_jobs}
    if ids:
        target["ids"] = [str(i) for i in ids[:max_jobs]]
    else:
        target["filter"] = (job_filter or JobFilter()).as_dict()
    with pool.connection() as conn:
        logged = conn.execute(audit_q.OPS_ACTION_INSERT, {
            "org_id": operator.org_id, "user_id": operator.user_id,
            "action": f"bulk_{action.value}", "target": json.dumps(target), "job_count": 0,
            "job_ids": [], "batches": 0, "finished": False}).fetchone()
    assert logged is not None
    action_id = int(logged["id"])
    reason = (f"cancelled by operator user {operator.user_id} of org {operator.org_id} "
              f"(bulk action {action_id})")
    changed: list[uuid.UUID] = []
    batches = 0
    pages = (_chunks(list(ids[:max_jobs]), batch_size) if ids
             else _filtered(pool, (job_filter or JobFilter()).narrowed(action), max_jobs,
                            batch_size))
    for page in pages:
        done = _batch(pool, action, page, action_id, reason)
        batches += 1
        changed += done
    with pool.connection() as conn:
        conn.execute(audit_q.OPS_ACTION_FINISH, {"id": action_id})
    return BulkOutcome(action_id, len(changed), batches, changed)


def _chunks(ids: list[uuid.UUID], size: int) -> Iterator[list[uuid.UUID]]:
    for start in range(0, len(ids), size):
        yield ids[start:start + size]


def _filtered(pool: ConnectionPool[DictConnection], job_filter: JobFilter, max_jobs: int,
              batch_size: int) -> Iterator[list[uuid.UUID]]:
    """The ids a filter reaches, a page at a time, newest first, at most `max_jobs` in all.

    NOTE: pages by keyset, so a job the action leaves unchanged (it finished meanwhile) is never
    read again, and the new jobs a retry inserts (newer than the cursor) are never reached.
    """
    after: tuple[datetime | None, uuid.UUID | None] = (None, None)
    left = max_jobs
    params = job_filter.params()
    while left > 0:
        limit = min(batch_size, left)
        with pool.connection() as conn, conn.transaction():
            conn.execute(q.CONSOLE_PLAN_SETTINGS)
            rows = conn.execute(q.JOB_LIST_IDS_FOR_CONSOLE_PAGE, {
                **params, "after_at": after[0], "after_id": after[1], "limit": limit}).fetchall()
        if not rows:
            return
        yield [r["id"] for r in rows]
        left -= len(rows)
        if len(rows) < limit:
            return
        after = (rows[-1]["created_at"], rows[-1]["id"])


def _batch(pool: ConnectionPool[DictConnection], action: BulkAction, ids: list[uuid.UUID],
           action_id: int, reason: str) -> list[uuid.UUID]:
    """Changes one batch and logs it, in one transaction; reports it once committed.

    A job whose row cannot be written is left out (and logged), never failing the batch or the
    action (jobqueue/engine/isolation.py).
    """
    rearmed: list[tuple[list[Row], uuid.UUID]] = []
    statement = (q.JOB_CANCEL_MANY_IF_ACTIVE if action is BulkAction.CANCEL
                 else q.JOB_RETRY_MANY_IF_FINISHED)

    def write(c: DictConnection, part: Sequence[uuid.UUID]) -> list[Row]:
        return c.execute(statement, {"ids": list(part), "reason": reason}).fetchall()

    with pool.connection() as conn, conn.transaction():
        written = write_isolated(conn, ids, write)
        for job_id, exc in written.failed:
            log.warning("ops.bulk_job_failed", job_id=str(job_id), action=action.value,
                        ops_action=action_id, error=str(exc).strip()[:300])
        rows = written.rows
        if action is BulkAction.CANCEL:
            done = [r["id"] for r in rows]
        else:
            done = [r["old_id"] for r in rows]
            rearmed = [(chains.rearm(conn, r["old_id"], r["job_id"]), r["job_id"])
                       for r in rows if r["rearm"]]
        conn.execute(audit_q.OPS_ACTION_ADD_BATCH, {"id": action_id, "job_ids": done})
    if action is BulkAction.CANCEL:
        _report_cancels(pool, rows, action_id)
    else:
        _report_retries(pool, rows, rearmed, action_id)
    return done


def _report_cancels(pool: ConnectionPool[DictConnection], rows: list[Row], action_id: int) -> None:
    if not rows:
        return
    wakeup.for_pool(pool).job_changed()
    dependents = [r["id"] for r in rows if r["dependents"]]
    if dependents:
        chains.settle(pool, dependents)
    running = sum(1 for r in rows if r["worker_claim"])
    for from_state, count in ((JobState.RUNNING, running), (JobState.QUEUED, len(rows) - running)):
        if count:
            transitions.record("job.cancelled", from_state, JobState.CANCELLED, count=count,
                               jobs=count, operator=True, ops_action=action_id)


def _report_retries(pool: ConnectionPool[DictConnection], rows: list[Row],
                    rearmed: list[tuple[list[Row], uuid.UUID]], action_id: int) -> None:
    if not rows:
        return
    wakeup.for_pool(pool).job_queued()
    for old_state, count in Counter(r["old_state"] for r in rows).items():
        transitions.record("job.superseded", JobState(old_state), JobState.SUPERSEDED,
                           count=count, jobs=count, ops_action=action_id)
    transitions.record("job.enqueued", None, JobState.QUEUED, count=len(rows), jobs=len(rows),
                       ops_action=action_id)
    for new_rows, retried in rearmed:
        chains.report_rearmed(new_rows, retried)
