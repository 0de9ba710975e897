"""Reads a caller may make: a job, a prompt with its response and jobs, recent changes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.errors import NotFound
from jobqueue.core.queries import entity as entity_q
from jobqueue.core.queries import job as job_q
from jobqueue.core.queries import mission as mission_q
from jobqueue.core.tokens import Caller

__all__ = ["get_job", "get_job_with_response", "get_prompt", "recent_changes"]

Row = dict[str, Any]

_LAST_ID = 2**63 - 1

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


def get_job_with_response(pool: ConnectionPool[DictConnection], caller: Caller,
                          job_id: uuid.UUID) -> Row:
    """Returns the job's row with `response_text`: its response's content, or None.

    Raises:
        NotFound: no such job in the caller's org.
    """
    scope = {"org_id": caller.org_id}
    with pool.connection() as conn:
        job = conn.execute(job_q.JOB_GET, {**scope, "job_id": job_id}).fetchone()
        if job is None:
            raise NotFound(f"job {job_id} not found")
        response = None
        if job["response_id"] is not None:
            response = conn.execute(entity_q.ENTITY_GET,
                                    {**scope, "id": job["response_id"]}).fetchone()
    return {**job, "response_text": response["content"] if response is not None else None}


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
    pool: ConnectionPool[DictConnection],
    caller: Caller,
    *,
    upto: int | None,
    after: int | None,
    since: datetime | None,
    limit: int,
    org_wide: bool = False,
) -> Row:
    """Returns `{as_of, items, next_cursor, has_more}`: a page of the viewer's event log, collapsed
    to each prompt it names with that prompt's latest job.

    The page is the viewer's first `limit` events in `(after, upto]`, in id order; items come in
    the order of their prompt's last event in the page. Passing `next_cursor` back as `after`
    continues exactly where the page ended: every id <= `upto` is final, so nothing is missed,
    and a heartbeat writes no event, so nothing comes back unless it changed again.

    Args:
        pool: database pool.
        caller: the viewer.
        upto: the SSE hub's cursor (every id at or below it is final); None while the hub is
            not ready, which answers an empty page that continues where the client was.
        after: the previous answer's `next_cursor`; None for a first call.
        since: a first call's start: the events stamped at or after it (None: the whole log).
        limit: most events read, hence most items answered.
        org_wide: the viewer's whole org instead of the viewer's own prompts.
    """
    scope = {"org_id": caller.org_id, "user_id": caller.user_id}
    as_of = datetime.now(UTC)
    items: list[Row] = []
    with pool.connection() as conn:
        if after is None:
            after = 0
            if since is not None:
                start = mission_q.MISSION_START_FOR_ORG if org_wide else mission_q.MISSION_START_FOR_USER
                row = conn.execute(start, {**scope, "since": since,
                                           "upto": _LAST_ID if upto is None else upto}).fetchone()
                assert row is not None
                after = int(row["after"])
        if upto is None or after >= upto:
            return {"as_of": as_of, "items": items, "next_cursor": after, "has_more": False}
        page_q = mission_q.MISSION_PAGE_FOR_ORG if org_wide else mission_q.MISSION_PAGE_FOR_USER
        events = conn.execute(page_q, {**scope, "after": after, "upto": upto,
                                       "limit": limit}).fetchall()
        # NOTE: a prompt's place is its last event in the page (dicts keep insertion order).
        last_event: dict[uuid.UUID, int] = {}
        for event in events:
            last_event.pop(event["prompt_id"], None)
            last_event[event["prompt_id"]] = event["id"]
        if last_event:
            rows = conn.execute(mission_q.MISSION_PROMPTS_LATEST, {
                "org_id": caller.org_id, "prompt_ids": list(last_event)}).fetchall()
            by_prompt = {row["prompt_id"]: row for row in rows}
            items = [by_prompt[p] for p in last_event if p in by_prompt]
    has_more = len(events) == limit
    return {"as_of": as_of, "items": items,
            "next_cursor": events[-1]["id"] if has_more else upto, "has_more": has_more}
