"""Reads a caller may make: a job, a prompt with its response and jobs, recent changes."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.errors import NotFound
from jobqueue.core.queries import entity as entity_q
from jobqueue.core.queries import job as job_q
from jobqueue.core.queries import mission as mission_q
from jobqueue.core.tokens import Caller

__all__ = ["get_job", "get_prompt", "recent_changes"]

Row = dict[str, Any]

# NOTE: without a cursor the client is catching up from nothing; bound the first answer.
FIRST_POLL_LIMIT = 200


def get_job(pool: ConnectionPool[DictConnection], caller: Caller, job_id: uuid.UUID) -> Row:
    """Returns the job's row.

    Raises:
        NotFound: no such job in the caller's org.
    """
    with pool.connection() as conn:
        row = conn.execute(job_q.JOB_GET, {"job_id": job_id, "org_id": caller.org_id}).fetchone()
    if row is None:
        raise NotFound(f"job {job_id} not found")
    return row


def get_prompt(pool: ConnectionPool[DictConnection], caller: Caller, prompt_id: uuid.UUID) -> Row:
    """Returns `{prompt, response, jobs}`: the response of the newest succeeded job, jobs newest first.

    Raises:
        NotFound: no such prompt in the caller's org.
    """
    scope = {"org_id": caller.org_id}
    with pool.connection() as conn:
        prompt = conn.execute(entity_q.ENTITY_GET, {**scope, "id": prompt_id}).fetchone()
        if prompt is None or prompt["kind"] != "prompt":
            raise NotFound(f"prompt {prompt_id} not found")
        jobs = conn.execute(job_q.JOB_LIST_FOR_PROMPT, {**scope, "prompt_id": prompt_id}).fetchall()
        response_id = next((j["response_id"] for j in jobs if j["response_id"] is not None), None)
        response = None
        if response_id is not None:
            response = conn.execute(entity_q.ENTITY_GET, {**scope, "id": response_id}).fetchone()
    return {"prompt": prompt, "response": response, "jobs": jobs}


def recent_changes(
    pool: ConnectionPool[DictConnection], caller: Caller, since: datetime | None
) -> Row:
    """Returns `{as_of, items}`: each prompt whose jobs changed at or after `since`, with its latest job.

    A client that passes back `as_of` as the next `since` never misses a change, even when
    transactions commit out of timestamp order; it may see a change twice (merge by prompt_id).
    """
    with pool.connection() as conn:
        cursor_row = conn.execute(mission_q.MISSION_CURSOR).fetchone()
        assert cursor_row is not None
        items = conn.execute(
            mission_q.MISSION_RECENT,
            {
                "org_id": caller.org_id,
                "since": since if since is not None else datetime.min,
                "limit": None if since is not None else FIRST_POLL_LIMIT,
            },
        ).fetchall()
    return {"as_of": cursor_row["as_of"], "items": items}
