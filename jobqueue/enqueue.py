"""Enqueue: write a prompt entity and its queued job together, with no provider call."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from jobqueue import metrics
from jobqueue.db import DictConnection
from jobqueue.errors import InvalidInput
from jobqueue.queries import entity as q
from jobqueue.tokens import Caller

__all__ = ["Enqueued", "enqueue"]


@dataclass(frozen=True)
class Enqueued:
    """What a submit returns: both ids and the job's first state."""

    prompt_id: uuid.UUID
    job_id: uuid.UUID
    state: str
    created_at: datetime


def enqueue(
    pool: ConnectionPool[DictConnection],
    caller: Caller,
    text: str,
    *,
    parent_id: uuid.UUID | None = None,
    priority: int = 50,
    max_attempts: int = 3,
    options: dict[str, Any] | None = None,
) -> Enqueued:
    """Writes the prompt and a queued job in one statement (one round trip, atomic).

    Args:
        pool: database pool.
        caller: org and user the prompt belongs to.
        text: the prompt text (validated by the caller: non-empty, no NUL).
        parent_id: the entity this prompt continues, in the caller's org.
        priority: 0 (most urgent) to 100.
        max_attempts: retry budget, attempts included.
        options: execution options (model, depth, ...).

    Returns:
        The new ids and state.

    Raises:
        InvalidInput: `parent_id` names no entity of the caller's org.
    """
    prompt_id, job_id = uuid.uuid4(), uuid.uuid4()
    with pool.connection() as conn:
        row = conn.execute(
            q.PROMPT_INSERT_WITH_JOB,
            {
                "prompt_id": prompt_id,
                "job_id": job_id,
                "parent_id": parent_id,
                "org_id": caller.org_id,
                "user_id": caller.user_id,
                "text": text,
                "priority": priority,
                "max_attempts": max_attempts,
                "options": Jsonb(options or {}),
            },
        ).fetchone()
    if row is None:
        raise InvalidInput(f"parent_id {parent_id} does not name an existing entity")
    metrics.ENQUEUED.inc()
    metrics.TRANSITIONS.labels(from_state="none", to_state="queued").inc()
    return Enqueued(
        prompt_id=row["prompt_id"], job_id=row["id"], state=row["state"],
        created_at=row["created_at"],
    )
