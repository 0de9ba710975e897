"""A running batch's lifecycle steps: count the jobs that ended, feed lines in as jobs while the
org's bulk lane has room, and end what a cancel or the window's end leaves unfinished.

The bulk lane: a batch's lines wait as `pending` rows, not as queued jobs, and are fed in as
room appears: an org has at most SA_BATCH_MAX_QUEUED batch jobs queued or running at once, and,
when SA_ORG_MAX_QUEUED is set, batch jobs never take the org's queue past half of it, so a
50,000-line batch never fills the queue an interactive request needs. Fed jobs run at
SA_BATCH_PRIORITY (60-90, after interactive work) inside the org's fair share and its running cap
(the claim's, unchanged).

Each function runs in the keeper's step transaction (the batch row locked) and returns what it
did; the keeper reports transitions and sends wake-ups once the step has committed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import psycopg

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import batch as q
from jobqueue.core.queries import idempotency as idempotency_q
from jobqueue.core.queries import job as job_q

__all__ = ["FeedRules", "Progress", "cancel_jobs", "count_ended", "end_pending", "feed"]

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


def count_ended(conn: DictConnection, batch: Row) -> Progress:
    """Moves the lines whose jobs ended to succeeded or failed, and the batch's counts with them."""
    row = conn.execute(q.BATCH_COUNT_ENDED, {"id": batch["id"]}, prepare=False).fetchone()
    assert row is not None
    return Progress(int(row["ended"]), int(row["in_flight"]), bool(row["backlog"]))


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


def feed(conn: DictConnection, batch: Row, rules: FeedRules) -> int:
    """Turns the next pending lines into queued jobs, as many as the lane has room for.

    A page the database refuses is split and tried again; a lone line it refuses ends invalid
    (a failed request), so one bad row never stops the batch.

    Returns:
        How many jobs were queued.
    """
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
            conn.execute(q.BATCH_REQUEST_FAIL_NEXT_PENDING, {"id": batch["id"], "error": json.dumps(
                {"code": "invalid_request", "message": f"the request cannot be queued: "
                                                       f"{type(exc).__name__}", "param": None})})
            continue
        assert row is not None
        fed += int(row["fed"])
        break
    return fed


def cancel_jobs(conn: DictConnection, batch: Row, *, states: tuple[str, ...], ends_as: str,
                reason: str) -> list[Row]:
    """Cancels the batch's jobs in `states` (a page at most); their lines end as `ends_as`.

    Returns:
        The jobs cancelled, each with the state it left.
    """
    return conn.execute(q.BATCH_JOBS_CANCEL_MANY, {
        "id": batch["id"], "states": list(states), "ends_as": ends_as, "reason": reason,
        "limit": _CANCEL_PAGE}, prepare=False).fetchall()


def end_pending(conn: DictConnection, batch: Row, ends_as: str) -> int:
    """Ends lines never fed (a page at most) as `ends_as`; returns how many."""
    cur = conn.execute(q.BATCH_END_PENDING_MANY, {"id": batch["id"], "ends_as": ends_as,
                                                  "limit": _END_PAGE}, prepare=False)
    return cur.rowcount
