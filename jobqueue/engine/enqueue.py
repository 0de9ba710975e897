"""Enqueue: write a prompt entity and its queued job together, with no provider call."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
import structlog
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from jobqueue.core import wakeup
from jobqueue.core.budget import Budgets
from jobqueue.core.db import DictConnection, reconnecting
from jobqueue.core.errors import IdempotencyKeyReused, InvalidInput, OverBudget, QueueFull
from jobqueue.core.queries import entity as q
from jobqueue.core.queries import idempotency as idempotency_q
from jobqueue.core.queries import job as job_q
from jobqueue.core.settings import DEFAULT_CHAIN_MAX_DEPTH, KEY_TTL_SECONDS
from jobqueue.core.states import JobState
from jobqueue.core.tokens import Caller
from jobqueue.engine import transitions
from jobqueue.engine.idempotency import request_fingerprint
from jobqueue.engine.spend import check_budget

__all__ = ["QUEUE_FULL_RETRY_AFTER", "Enqueued", "Submission", "enqueue",
           "enqueue_many"]

QUEUE_FULL_RETRY_AFTER = 30
"""Seconds a client is told to wait (Retry-After) when its org's queue is full."""


_ENDED = frozenset({JobState.FAILED, JobState.CANCELLED, JobState.SUPERSEDED})

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


@dataclass(frozen=True)
class Submission:
    """One prompt of a batch, validated by the caller (the fields of POST /prompt)."""

    text: str
    parent_id: uuid.UUID | None = None
    priority: int = 50
    max_attempts: int = 3
    options: dict[str, Any] = field(default_factory=dict)
    run_at: datetime | None = None
    delay_seconds: int | None = None
    after: uuid.UUID | None = None

    def schedule(self) -> dict[str, Any]:
        """The scheduling fields given, as they join the request fingerprint."""
        return {name: value for name, value in (
            ("run_at", self.run_at.isoformat() if self.run_at is not None else None),
            ("delay_seconds", self.delay_seconds),
            ("after", str(self.after) if self.after is not None else None)) if value is not None}

    def fingerprint(self) -> bytes:
        """The request fingerprint of this prompt (`request_fingerprint`)."""
        return request_fingerprint(self.text, self.parent_id, self.priority, self.max_attempts,
                                   self.options, self.schedule())


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
    after: uuid.UUID | None = None,
    max_chain_depth: int = DEFAULT_CHAIN_MAX_DEPTH,
    budgets: Budgets | None = None,
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
        after: a job (or prompt: its latest job) of the caller's org this one waits for; it runs
            once that one succeeded (and no sooner than `run_at` or `delay_seconds`).
        max_chain_depth: the most predecessors the new job may have in its chain.
        budgets: the per-org budgets; an org past one gets no new job, but a repeat of a live
            key is still replayed (`check_budget`, after the key).

    Returns:
        The new ids and state (or the original ones, for a replay).

    Raises:
        InvalidInput: `parent_id` names no entity of the caller's org, or `after` no job or
            prompt of it, or a job already failed, cancelled or superseded, or one whose chain
            already has `max_chain_depth` links.
        IdempotencyKeyReused: the key is bound to a different request.
        QueueFull: the org already has `max_queued` queued jobs.
        OverBudget: the org has spent a budget, and the request is no replay.
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
        "after": after,
        "max_chain_depth": max_chain_depth,
    }
    if idempotency_key is not None:
        params["request_hash"] = Submission(text, parent_id, priority, max_attempts, opts, run_at,
                                            delay_seconds, after).fingerprint()
    spent_key = _refuse_unless_replay(pool, caller, idempotency_key, budgets)
    if spent_key is not None:
        return _replayed(spent_key, params["request_hash"], caller)

    def attempt(conn: DictConnection) -> tuple[Row, Row | None]:
        row = _insert_or_find(conn, params, max_queued)
        if row["id"] is not None or idempotency_key is None:
            return row, None
        return row, conn.execute(idempotency_q.IDEMPOTENCY_KEY_GET_LIVE, {
            "org_id": caller.org_id, "user_id": caller.user_id, "key": idempotency_key,
            "ttl": KEY_TTL_SECONDS}).fetchone()

    for _ in range(_KEY_ATTEMPTS):
        params["prompt_id"], params["job_id"] = uuid.uuid4(), uuid.uuid4()
        # NOTE: a connection the server ends under the statement is retried once with the same
        # ids, which tell a committed first try (_insert_or_find).
        row, key_row = reconnecting(pool, attempt)
        if key_row is not None:
            return _replayed(key_row, params["request_hash"], caller)
        if row["id"] is not None:
            scheduled = run_at is not None or bool(delay_seconds)
            if not row["waiting"]:
                wakeup.for_pool(pool).job_queued(
                    row["scheduled_for"].timestamp() if scheduled else None)
            extra: dict[str, Any] = {}
            if scheduled:
                extra["scheduled_for"] = row["scheduled_for"].isoformat()
            if after is not None:
                extra.update(after=str(after), waiting=row["waiting"])
            transitions.record("job.enqueued", None, JobState.QUEUED, job_id=str(row["id"]),
                               prompt_id=str(row["prompt_id"]), org_id=caller.org_id,
                               user_id=caller.user_id, priority=priority, **extra)
            return Enqueued(prompt_id=row["prompt_id"], job_id=row["id"], state=row["state"],
                            created_at=row["created_at"])
        _refuse(row, parent_id, after, max_chain_depth, max_queued)
    raise RuntimeError(f"enqueue: idempotency key kept changing hands ({_KEY_ATTEMPTS} tries)")


def _refuse(row: Row, parent_id: uuid.UUID | None, after: uuid.UUID | None,
            max_chain_depth: int, max_queued: int) -> None:
    """Raises the guard that kept the enqueue statement from writing; returns when none did
    (the key it found changed hands before it was read: the enqueue tries again).

    Raises:
        InvalidInput: the parent, the `after` job or its chain's depth.
        QueueFull: the org's queued cap.
    """
    if not row["parent_ok"]:
        raise InvalidInput(f"parent_id {parent_id} does not name an existing entity")
    if after is not None and row["after_state"] is None:
        raise InvalidInput(f"after: {after} names no job or prompt of your organization")
    if after is not None and row["after_state"] in _ENDED:
        raise InvalidInput(f"after: its job is {row['after_state']} and will never succeed; "
                           "retry it first")
    if not row["depth_ok"]:
        raise InvalidInput(f"after: its chain already has {max_chain_depth} jobs before this "
                           "one (SA_CHAIN_MAX_DEPTH, the most allowed)")
    if not row["under_cap"]:
        raise QueueFull(
            f"your organization already has {max_queued} queued jobs (the most allowed); "
            "retry when some have started", retry_after=QUEUE_FULL_RETRY_AFTER)


def enqueue_many(
    pool: ConnectionPool[DictConnection],
    caller: Caller,
    items: Sequence[Submission],
    *,
    idempotency_key: str | None = None,
    max_queued: int = 0,
    budgets: Budgets | None = None,
) -> list[Enqueued]:
    """Writes a batch of prompts and their queued jobs in one statement: all of them or none.

    Args:
        pool: database pool.
        caller: org and user the prompts belong to.
        items: the validated prompts, in the order their ids are answered.
        idempotency_key: one key for the whole batch; a repeat of the same batch within
            `KEY_TTL_SECONDS` answers the original ids (`replayed`) and writes nothing.
        max_queued: as for `enqueue`; the whole batch must fit.
        budgets: as for `enqueue`: a repeat of a live key is replayed even past a budget.

    Returns:
        One Enqueued per item, in input order.

    Raises:
        InvalidInput: some `parent_id` names no entity of the caller's org (each position named).
        IdempotencyKeyReused: the key is bound to a different request.
        QueueFull: the batch does not fit under the org's cap.
        OverBudget: the org has spent a budget, and the request is no replay.
    """
    params: dict[str, Any] = {
        "org_id": caller.org_id, "user_id": caller.user_id,
        "parent_ids": [item.parent_id for item in items],
        "texts": [item.text for item in items],
        "priorities": [item.priority for item in items],
        "max_attempts": [item.max_attempts for item in items],
        # PERF: options go as JSON text, cast by the statement: cheaper than one Jsonb per item.
        "options": [json.dumps(item.options) for item in items],
        "run_ats": [item.run_at for item in items],
        "delays": [item.delay_seconds for item in items],
        "max_queued": max_queued, "idempotency_key": idempotency_key, "request_hash": None,
        "key_ttl": KEY_TTL_SECONDS,
    }
    if idempotency_key is not None:
        params["request_hash"] = hashlib.sha256(
            b"batch" + b"".join(item.fingerprint() for item in items)).digest()
    spent_key = _refuse_unless_replay(pool, caller, idempotency_key, budgets)
    if spent_key is not None:
        return _replayed_many(spent_key, params["request_hash"], caller, len(items))

    def attempt(conn: DictConnection) -> tuple[Row, Row | None]:
        row = _insert_many_or_find(conn, params, max_queued)
        if row["written"] or idempotency_key is None:
            return row, None
        return row, conn.execute(idempotency_q.IDEMPOTENCY_KEY_GET_LIVE, {
            "org_id": caller.org_id, "user_id": caller.user_id, "key": idempotency_key,
            "ttl": KEY_TTL_SECONDS}).fetchone()

    for _ in range(_KEY_ATTEMPTS):
        params["prompt_ids"] = [uuid.uuid4() for _ in items]
        params["job_ids"] = [uuid.uuid4() for _ in items]
        # NOTE: as for one prompt: retried once with the same ids when the server ended the
        # connection under the statement; the ids tell a committed first try.
        row, key_row = reconnecting(pool, attempt)
        if key_row is not None:
            return _replayed_many(key_row, params["request_hash"], caller, len(items))
        if row["written"]:
            sender = wakeup.for_pool(pool)
            if row["written"] > len(row["dues"] or ()):
                sender.job_queued()
            for due in row["dues"] or ():
                sender.job_queued(due)
            transitions.record("job.enqueued", None, JobState.QUEUED, count=row["written"],
                               jobs=row["written"], org_id=caller.org_id, user_id=caller.user_id)
            return [Enqueued(prompt_id=prompt_id, job_id=job_id, state=JobState.QUEUED.value,
                             created_at=row["created_at"])
                    for prompt_id, job_id in zip(params["prompt_ids"], params["job_ids"],
                                                 strict=True)]
        if row["bad_parents"]:
            raise InvalidInput("; ".join(
                f"prompts[{n}].parent_id: does not name an existing entity"
                for n in row["bad_parents"]))
        if not row["under_cap"]:
            raise QueueFull(
                f"this batch would take your organization past {max_queued} queued jobs (the "
                "most allowed); retry when some have started", retry_after=QUEUE_FULL_RETRY_AFTER)
    raise RuntimeError(f"enqueue: idempotency key kept changing hands ({_KEY_ATTEMPTS} tries)")


def _insert(conn: DictConnection, params: dict[str, Any], max_queued: int,
            statement: str = q.PROMPT_INSERT_WITH_JOB) -> Row:
    """Runs an enqueue statement; under the org's enqueue lock when a cap is set."""
    if max_queued > 0:
        # NOTE: the lock makes the cap exact: see ORG_ENQUEUE_LOCK.
        # PERF: BEGIN, lock, plan settings, insert, COMMIT: four round trips more than the lone statement
        # (about 0.4 ms on a local socket); SA_ORG_MAX_QUEUED=0 goes back to one. Pipelining them
        # measured slower locally. The lock is held for one insert, so a burst from one org
        # drains at thousands of submits per second, and other orgs never wait on it.
        with conn.transaction():
            conn.execute(idempotency_q.ORG_ENQUEUE_LOCK, {"org_id": params["org_id"]})
            # NOTE: so the cap's count walks sa_job_org_queued_idx, never the table.
            conn.execute(job_q.JOB_PLAN_SETTINGS)
            row = conn.execute(statement, params).fetchone()
    else:
        row = conn.execute(statement, params).fetchone()
    assert row is not None  # NOTE: the statement always answers one row (the gate's)
    return row


def _insert_or_find(conn: DictConnection, params: dict[str, Any], max_queued: int) -> Row:
    """PROMPT_INSERT_WITH_JOB, or, when its prompt id is already taken, the job it wrote: only a
    second try after a lost answer meets its own ids (uuid4), so the first one committed."""
    try:
        return _insert(conn, params, max_queued)
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.constraint_name != "sa_entity_pkey":
            raise
    found = conn.execute(job_q.JOB_GET_AS_ENQUEUED, {"job_id": params["job_id"]}).fetchone()
    assert found is not None  # NOTE: written with the prompt, in the same statement
    return found


def _insert_many_or_find(conn: DictConnection, params: dict[str, Any], max_queued: int) -> Row:
    """PROMPT_INSERT_WITH_JOB_MANY, or, when its first prompt id is already taken, what the first
    try (whose answer was lost) committed: all of its jobs, in one statement."""
    try:
        return _insert(conn, params, max_queued, q.PROMPT_INSERT_WITH_JOB_MANY)
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.constraint_name != "sa_entity_pkey":
            raise
    found = conn.execute(job_q.JOB_GET_AS_ENQUEUED, {"job_id": params["job_ids"][0]}).fetchone()
    assert found is not None  # NOTE: written with the prompts, in the same statement
    return {"written": len(params["job_ids"]), "dues": None, "created_at": found["created_at"]}


def _refuse_unless_replay(pool: ConnectionPool[DictConnection], caller: Caller, key: str | None,
                          budgets: Budgets | None) -> Row | None:
    """Refuses new work of an org past its budget; answers the key's row when it is a repeat.

    NOTE: a repeat of a key is answered what its first request got, whatever the org spent
    since: the replay comes before the budget, and only new work is refused.
    PERF: the key is read only once the budget refuses, so a submit under budget costs the one
    spend read it always did (none with no budget set), and a replay under budget is still told
    by the enqueue statement itself.

    Raises:
        OverBudget: the org has spent a budget, and `key` is not a live key of the caller.
    """
    if budgets is None:
        return None
    try:
        check_budget(pool, caller.org_id, budgets)
    except OverBudget:
        if key is None:
            raise
        with pool.connection() as conn:
            key_row = conn.execute(idempotency_q.IDEMPOTENCY_KEY_GET_LIVE, {
                "org_id": caller.org_id, "user_id": caller.user_id, "key": key,
                "ttl": KEY_TTL_SECONDS}).fetchone()
        if key_row is None:
            raise
        return key_row
    return None


def _replay(key_row: Row, request_hash: bytes) -> Enqueued:
    """Answers a repeated key: the original ids when the request is the same, else an error."""
    if not hmac.compare_digest(bytes(key_row["request_hash"]), request_hash):
        raise IdempotencyKeyReused(
            "this Idempotency-Key was already used with a different request body; "
            "use a new key for a new request")
    return Enqueued(prompt_id=key_row["prompt_id"], job_id=key_row["job_id"], state="queued",
                    created_at=key_row["created_at"], replayed=True)


def _replayed(key_row: Row, request_hash: bytes, caller: Caller) -> Enqueued:
    """A repeated prompt's answer (`_replay`), logged."""
    replayed = _replay(key_row, request_hash)
    log.info("job.enqueue_replayed", job_id=str(replayed.job_id),
             prompt_id=str(replayed.prompt_id), org_id=caller.org_id)
    return replayed


def _replayed_many(key_row: Row, request_hash: bytes, caller: Caller,
                   count: int) -> list[Enqueued]:
    """A repeated batch's answer: its original ids in input order, logged (`_replay` checks)."""
    _replay(key_row, request_hash)
    log.info("job.enqueue_replayed", jobs=count, org_id=caller.org_id)
    return [Enqueued(prompt_id=prompt_id, job_id=job_id, state="queued",
                     created_at=key_row["created_at"], replayed=True)
            for prompt_id, job_id in zip(key_row["batch_prompt_ids"] or [],
                                         key_row["batch_job_ids"] or [], strict=True)]
