"""Enqueue: write a prompt entity and its queued job together, with no provider call."""

from __future__ import annotations

import hmac
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from jobqueue.core import wakeup
from jobqueue.core.db import DictConnection
from jobqueue.core.errors import IdempotencyKeyReused, InvalidInput, QueueFull
from jobqueue.core.queries import entity as q
from jobqueue.core.queries import idempotency as idempotency_q
from jobqueue.core.settings import KEY_TTL_SECONDS
from jobqueue.core.states import JobState
from jobqueue.core.tokens import Caller
from jobqueue.engine import transitions
from jobqueue.engine.idempotency import request_fingerprint

__all__ = ["QUEUE_FULL_RETRY_AFTER", "Enqueued", "enqueue"]

QUEUE_FULL_RETRY_AFTER = 30
"""Seconds a client is told to wait (Retry-After) when its org's queue is full."""

# NOTE: a live key can expire between the enqueue statement (which found it live) and the read
# of its row; the enqueue is then simply tried again, and the next try takes the key over.
_KEY_ATTEMPTS = 3

Row = dict[str, Any]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Enqueued:
    """What a submit returns: both ids, the job's first state, and whether it was a replay."""

    prompt_id: uuid.UUID
    job_id: uuid.UUID
    state: str
    created_at: datetime
    replayed: bool = False


def enqueue(
    pool: ConnectionPool[DictConnection],
    caller: Caller,
    text: str,
    *,
    parent_id: uuid.UUID | None = None,
    priority: int = 50,
    max_attempts: int = 3,
    options: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
    max_queued: int = 0,
    run_at: datetime | None = None,
    delay_seconds: int | None = None,
) -> Enqueued:
    """Writes the prompt and a queued job in one statement (atomic), unless a guard says no.

    Args:
        pool: database pool.
        caller: org and user the prompt belongs to (authenticated by the caller).
        text: the prompt text (validated by the caller: non-empty, no NUL).
        parent_id: the entity this prompt continues, in the caller's org.
        priority: 0 (most urgent) to 100.
        max_attempts: retry budget, attempts included.
        options: execution options (model, depth, ...).
        idempotency_key: the client's key (scoped to the caller's org and user); a repeat of the
            same request with the same key within `KEY_TTL_SECONDS` returns the first answer,
            with `replayed` set, and writes nothing.
        max_queued: the most jobs the caller's org may have queued at once; 0 for no cap.
        run_at: when the job becomes claimable (validated by the caller: not past, not absurd).
        delay_seconds: or: how long from the database's now until it does.

    Returns:
        The new ids and state (or the original ones, for a replay).

    Raises:
        InvalidInput: `parent_id` names no entity of the caller's org.
        IdempotencyKeyReused: the key is bound to a different request.
        QueueFull: the org already has `max_queued` queued jobs.
    """
    opts = options or {}
    params: dict[str, Any] = {
        "parent_id": parent_id,
        "org_id": caller.org_id,
        "user_id": caller.user_id,
        "text": text,
        "priority": priority,
        "max_attempts": max_attempts,
        "options": Jsonb(opts),
        "max_queued": max_queued,
        "idempotency_key": idempotency_key,
        "request_hash": None,
        "key_ttl": KEY_TTL_SECONDS,
        "run_at": run_at,
        "delay_seconds": delay_seconds,
    }
    if idempotency_key is not None:
        schedule = {name: value for name, value in (
            ("run_at", run_at.isoformat() if run_at is not None else None),
            ("delay_seconds", delay_seconds)) if value is not None}
        params["request_hash"] = request_fingerprint(text, parent_id, priority, max_attempts, opts,
                                                     schedule)
    for _ in range(_KEY_ATTEMPTS):
        params["prompt_id"], params["job_id"] = uuid.uuid4(), uuid.uuid4()
        with pool.connection() as conn:
            row = _insert(conn, params, max_queued)
            if row["id"] is None and idempotency_key is not None:
                key_row = conn.execute(idempotency_q.IDEMPOTENCY_KEY_GET_LIVE, {
                    "org_id": caller.org_id, "user_id": caller.user_id, "key": idempotency_key,
                    "ttl": KEY_TTL_SECONDS}).fetchone()
                if key_row is not None:
                    replayed = _replay(key_row, params["request_hash"])
                    log.info("job.enqueue_replayed", job_id=str(replayed.job_id),
                             prompt_id=str(replayed.prompt_id), org_id=caller.org_id)
                    return replayed
        if row["id"] is not None:
            scheduled = run_at is not None or bool(delay_seconds)
            wakeup.for_pool(pool).job_queued(
                row["scheduled_for"].timestamp() if scheduled else None)
            transitions.record("job.enqueued", None, JobState.QUEUED, job_id=str(row["id"]),
                               prompt_id=str(row["prompt_id"]), org_id=caller.org_id,
                               user_id=caller.user_id, priority=priority,
                               **({"scheduled_for": row["scheduled_for"].isoformat()}
                                  if scheduled else {}))
            return Enqueued(prompt_id=row["prompt_id"], job_id=row["id"], state=row["state"],
                            created_at=row["created_at"])
        if not row["parent_ok"]:
            raise InvalidInput(f"parent_id {parent_id} does not name an existing entity")
        if not row["under_cap"]:
            raise QueueFull(
                f"your organization already has {max_queued} queued jobs (the most allowed); "
                "retry when some have started", retry_after=QUEUE_FULL_RETRY_AFTER)
    raise RuntimeError(f"enqueue: idempotency key kept changing hands ({_KEY_ATTEMPTS} tries)")


def _insert(conn: DictConnection, params: dict[str, Any], max_queued: int) -> Row:
    """Runs the enqueue statement; under the org's enqueue lock when a cap is set."""
    if max_queued > 0:
        # NOTE: the lock makes the cap exact: see ORG_ENQUEUE_LOCK.
        # PERF: BEGIN, lock, insert, COMMIT: three round trips more than the lone statement
        # (about 0.3 ms on a local socket); SA_ORG_MAX_QUEUED=0 goes back to one. Pipelining them
        # measured slower locally. The lock is held for one insert, so a burst from one org
        # drains at thousands of submits per second, and other orgs never wait on it.
        with conn.transaction():
            conn.execute(idempotency_q.ORG_ENQUEUE_LOCK, {"org_id": params["org_id"]})
            row = conn.execute(q.PROMPT_INSERT_WITH_JOB, params).fetchone()
    else:
        row = conn.execute(q.PROMPT_INSERT_WITH_JOB, params).fetchone()
    assert row is not None  # NOTE: the statement always answers one row (the gate's)
    return row


def _replay(key_row: Row, request_hash: bytes) -> Enqueued:
    """Answers a repeated key: the original ids when the request is the same, else an error."""
    if not hmac.compare_digest(bytes(key_row["request_hash"]), request_hash):
        raise IdempotencyKeyReused(
            "this Idempotency-Key was already used with a different request body; "
            "use a new key for a new request")
    return Enqueued(prompt_id=key_row["prompt_id"], job_id=key_row["job_id"], state="queued",
                    created_at=key_row["created_at"], replayed=True)
