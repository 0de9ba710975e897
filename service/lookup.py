"""Reads a caller may make: a job, a response, a prompt with its response and jobs, recent changes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, reconnecting
from jobqueue.core.errors import NotFound
from jobqueue.core.queries import entity as entity_q
from jobqueue.core.queries import job as job_q
from jobqueue.core.queries import mission as mission_q
from jobqueue.core.tokens import Caller
from service.holds import Holds

__all__ = ["JobsPage", "get_job", "get_job_with_response", "get_prompt", "get_response",
           "prompts_latest", "recent_changes"]

Row = dict[str, Any]

_LAST_ID = 2**63 - 1


@dataclass(frozen=True, slots=True)
class JobsPage:
    """Which of a prompt's jobs to answer: `limit` at most, and at most `max_bytes` of their
    options and error messages, after the job `before` names ((created_at, id); None: the
    newest first)."""

    limit: int
    max_bytes: int
    before: tuple[datetime, uuid.UUID] | None = None


def get_job(pool: ConnectionPool[DictConnection], caller: Caller, job_id: uuid.UUID) -> Row:
    """Returns the job's row.

    Raises:
        NotFound: no such job in the caller's org.
    """
    row = reconnecting(pool, lambda conn: conn.execute(
        job_q.JOB_GET, {"job_id": job_id, "org_id": caller.org_id}).fetchone())
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

    def read(conn: DictConnection) -> Row:
        job = conn.execute(job_q.JOB_GET, {**scope, "job_id": job_id}).fetchone()
        if job is None:
            raise NotFound(f"job {job_id} not found")
        response = None
        if job["response_id"] is not None:
            response = conn.execute(entity_q.ENTITY_GET,
                                    {**scope, "id": job["response_id"]}).fetchone()
        return {**job, "response_text": response["content"] if response is not None else None}

    return reconnecting(pool, read)


def get_response(pool: ConnectionPool[DictConnection], caller: Caller,
                 response_id: uuid.UUID) -> Row:
    """Returns a response entity, its content whole.

    Raises:
        NotFound: no such response in the caller's org.
    """
    row = reconnecting(pool, lambda conn: conn.execute(
        entity_q.ENTITY_GET, {"org_id": caller.org_id, "id": response_id}).fetchone())
    if row is None or row["kind"] != "response":
        raise NotFound(f"response {response_id} not found")
    return row


def get_prompt(pool: ConnectionPool[DictConnection], caller: Caller, prompt_id: uuid.UUID,
               page: JobsPage) -> Row:
    """Returns `{prompt, response, jobs, next_cursor, has_more}`: the response of the newest job
    that has one, and a page of the jobs, newest first.

    `next_cursor` is the (created_at, id) of the page's last job when more remain, else None.

    Raises:
        NotFound: no such prompt in the caller's org.
    """
    scope = {"org_id": caller.org_id, "prompt_id": prompt_id}
    before_at, before_id = page.before or (None, None)

    def read_page(conn: DictConnection) -> tuple[Row, list[Row], Row | None]:
        prompt = conn.execute(entity_q.ENTITY_GET, {**scope, "id": prompt_id}).fetchone()
        if prompt is None or prompt["kind"] != "prompt":
            raise NotFound(f"prompt {prompt_id} not found")
        # NOTE: in a transaction, or the plan settings (SET LOCAL) would end with their own
        # statement in autocommit.
        with conn.transaction():
            conn.execute(job_q.JOB_PAGE_PLAN_SETTINGS)
            rows = conn.execute(job_q.JOB_LIST_FOR_PROMPT_PAGE, {
                **scope, "before_at": before_at, "before_id": before_id,
                "limit": page.limit + 1, "max_bytes": page.max_bytes}).fetchall()
            latest = conn.execute(job_q.JOB_GET_LATEST_RESPONSE_ID_FOR_PROMPT, scope).fetchone()
        response = None
        if latest is not None:
            response = conn.execute(entity_q.ENTITY_GET,
                                    {**scope, "id": latest["response_id"]}).fetchone()
        return prompt, rows, response

    prompt, rows, response = reconnecting(pool, read_page)
    read = rows[0]["read"] if rows else 0
    jobs = [{k: v for k, v in row.items() if k != "read"} for row in rows[:page.limit]]
    has_more = read > len(jobs)
    return {"prompt": prompt, "response": response, "jobs": jobs, "has_more": has_more,
            "next_cursor": (jobs[-1]["created_at"], jobs[-1]["id"]) if has_more else None}


def prompts_latest(conn: DictConnection, org_id: int, prompt_ids: list[uuid.UUID], *,
                   text_chars: int, max_bytes: int, holds: Holds) -> tuple[list[Row], bool]:
    """Returns the feed items of `prompt_ids` (the org's only), in that order, each with its
    latest job and what holds it back if it is due (`held`, see service/holds.py); and whether
    the list was cut short because the texts passed `max_bytes`."""
    if not prompt_ids:
        return [], False
    with conn.transaction():
        conn.execute(job_q.JOB_PAGE_PLAN_SETTINGS)
        rows = conn.execute(mission_q.MISSION_PROMPTS_LATEST, {
            "org_id": org_id, "prompt_ids": prompt_ids, "text_chars": text_chars,
            "max_bytes": max_bytes}).fetchall()
    items = [{k: v for k, v in row.items() if k != "read"} for row in rows]
    holds.mark(conn, org_id, items)
    return items, bool(rows) and rows[0]["read"] > len(rows)


def recent_changes(
    pool: ConnectionPool[DictConnection],
    caller: Caller,
    *,
    upto: int | None,
    after: int | None,
    since: datetime | None,
    limit: int,
    text_chars: int,
    max_bytes: int,
    holds: Holds,
    org_wide: bool = False,
) -> Row:
    """Returns `{as_of, items, next_cursor, has_more}`: a page of the viewer's event log, collapsed
    to each prompt it names with that prompt's latest job.

    The page is the viewer's first `limit` events in `(after, upto]`, in id order; items come in
    the order of their prompt's last event in the page. Passing `next_cursor` back as `after`
    continues exactly where the page ended: every id <= `upto` is final, so nothing is missed,
    and a heartbeat writes no event, so nothing comes back unless it changed again. Texts come
    cut to `text_chars` characters; once the items' texts pass `max_bytes`, the page ends at
    the last item that fit and `next_cursor` at its last event (the items after it changed
    after that event, so the next page brings them).

    Args:
        pool: database pool.
        caller: the viewer.
        upto: the SSE hub's cursor (every id at or below it is final); None while the hub is
            not ready, which answers an empty page that continues where the client was.
        after: the previous answer's `next_cursor`; None for a first call.
        since: a first call's start: the events stamped at or after it (None: the whole log).
        limit: most events read, hence most items answered.
        text_chars: most characters of a prompt's or a response's text in an item.
        max_bytes: the texts' bytes past which the page ends (the first item always comes).
        holds: the org's limits that hold due jobs back (each item's `held`).
        org_wide: the viewer's whole org instead of the viewer's own prompts.
    """
    scope = {"org_id": caller.org_id, "user_id": caller.user_id}
    as_of = datetime.now(UTC)

    def read(conn: DictConnection) -> dict[str, Any]:
        start_after = after
        items: list[Row] = []
        if start_after is None:
            start_after = 0
            if since is not None:
                start = mission_q.MISSION_START_FOR_ORG if org_wide else mission_q.MISSION_START_FOR_USER
                row = conn.execute(start, {**scope, "since": since,
                                           "upto": _LAST_ID if upto is None else upto}).fetchone()
                assert row is not None
                start_after = int(row["after"])
        if upto is None or start_after >= upto:
            return {"as_of": as_of, "items": items, "next_cursor": start_after, "has_more": False}
        page_q = mission_q.MISSION_PAGE_FOR_ORG if org_wide else mission_q.MISSION_PAGE_FOR_USER
        events = conn.execute(page_q, {**scope, "after": start_after, "upto": upto,
                                       "limit": limit}).fetchall()
        # NOTE: a prompt's place is its last event in the page (dicts keep insertion order).
        last_event: dict[uuid.UUID, int] = {}
        for event in events:
            last_event.pop(event["prompt_id"], None)
            last_event[event["prompt_id"]] = event["id"]
        items, cut = prompts_latest(conn, caller.org_id, list(last_event), text_chars=text_chars,
                                    max_bytes=max_bytes, holds=holds)
        if cut:
            return {"as_of": as_of, "items": items,
                    "next_cursor": last_event[items[-1]["prompt_id"]], "has_more": True}
        has_more = len(events) == limit
        return {"as_of": as_of, "items": items,
                "next_cursor": events[-1]["id"] if has_more else upto, "has_more": has_more}

    # NOTE: a read: safe to run again on a fresh connection when the server ended the first.
    return reconnecting(pool, read)
