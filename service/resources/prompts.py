"""POST /prompt, POST /prompts/batch and GET /prompts/{id}."""

from __future__ import annotations

import uuid

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.core.states import TERMINAL
from jobqueue.engine.enqueue import Enqueued, Submission, enqueue, enqueue_many
from jobqueue.engine.submit_group import SubmitGroup, is_plain
from service.contract import (
    JOBS_CURSOR,
    JOBS_LIMIT,
    PREFER,
    check_routable,
    parse_batch,
    parse_prompt,
)
from service.events.hub import EventHub
from service.lookup import JobsPage, get_job_with_response, get_prompt
from service.parsers import (
    encode_jobs_cursor,
    parse_idempotency_key,
    parse_jobs_cursor,
    parse_limit,
    parse_prefer_wait,
)
from service.waits import Waits

__all__ = ["IDEMPOTENCY_KEY_HEADER", "PREFERENCE_APPLIED_HEADER", "REPLAYED_HEADER",
           "WAIT_SKIPPED_HEADER", "PromptBatch", "PromptCollection", "PromptItem"]

IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
PREFERENCE_APPLIED_HEADER = "Preference-Applied"
WAIT_SKIPPED_HEADER = "SA-Wait-Skipped"
"""Sent (`cap`) when `Prefer: wait` was not applied: the token or the process already holds its
cap of waits (SA_WAIT_MAX_PER_TOKEN, SA_WAIT_MAX), so the submit is answered 202 at once."""


class PromptCollection:
    """Submits a prompt: 202 at once, the work happens in a worker."""

    def __init__(self, pool: ConnectionPool[DictConnection], settings: Settings,
                 hub: EventHub, waits: Waits) -> None:
        self._pool = pool
        self._hub = hub
        self._waits = waits
        self._max_chars = settings.max_prompt_chars
        self._max_queued = settings.org_max_queued
        self._max_chain_depth = settings.chain_max_depth
        self._routes = settings.routes
        self._budgets = settings.budgets
        # NOTE: one per app, so one per web process: concurrent plain submits share a commit.
        self._group = SubmitGroup(pool)

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Writes the prompt and its queued job; answers 202 with both ids.

        With an Idempotency-Key already used for the same request, answers the original ids
        with `Idempotent-Replayed: true` and writes nothing, even once the org's budget is
        spent (only new work is refused). With `Prefer: wait=N`, answers 200 with the job and
        its `response_text` if the job ends within N seconds; past the wait caps the submit is
        still accepted and answered 202 at once, with SA-Wait-Skipped.
        """
        key = parse_idempotency_key(req.get_header(IDEMPOTENCY_KEY_HEADER))
        wait = parse_prefer_wait(req.get_header(PREFER.name))
        request = parse_prompt(req.get_media(), self._max_chars)
        check_routable([request], self._routes)
        submission = Submission(text=request.text, parent_id=request.parent_id,
                                priority=request.priority, max_attempts=request.max_attempts,
                                options=request.options, run_at=request.run_at,
                                delay_seconds=request.delay_seconds, after=request.after)
        if is_plain(submission, idempotency_key=key, max_queued=self._max_queued):
            done = self._group.submit(req.context.caller, submission, budgets=self._budgets)
        else:
            done = enqueue(
                self._pool, req.context.caller, request.text, parent_id=request.parent_id,
                priority=request.priority, max_attempts=request.max_attempts,
                options=request.options, idempotency_key=key, max_queued=self._max_queued,
                run_at=request.run_at, delay_seconds=request.delay_seconds, after=request.after,
                max_chain_depth=self._max_chain_depth, budgets=self._budgets,
            )
        if done.replayed:
            resp.set_header(REPLAYED_HEADER, "true")
        resp.location = f"{req.root_path}/sa-core/v1/jobs/{done.job_id}"
        finished = None
        if wait:
            with self._waits.admit(req.context.token_digest) as slot:
                if slot is None:
                    resp.set_header(WAIT_SKIPPED_HEADER, "cap")
                else:
                    resp.set_header(PREFERENCE_APPLIED_HEADER, f"wait={wait}")
                    finished = self._wait(req, done, wait)
        if finished is not None:
            resp.status = falcon.HTTP_200
            resp.media = finished
            return
        resp.status = falcon.HTTP_202
        resp.media = {"prompt_id": done.prompt_id, "job_id": done.job_id, "state": done.state}

    def _wait(self, req: falcon.Request, done: Enqueued, seconds: int) -> dict[str, object] | None:
        """Waits up to `seconds` for the job to end; returns it with its response, else None.

        NOTE: woken by the event hub, which already reads every transition once per process;
        the request holds no pool connection while it waits, only for the two short reads.
        """
        with self._hub.watching(done.job_id) as finished:
            # NOTE: read once after watching: the job may have ended before the watch began.
            job = get_job_with_response(self._pool, req.context.caller, done.job_id)
            if job["state"] not in TERMINAL and finished.wait(seconds):
                job = get_job_with_response(self._pool, req.context.caller, done.job_id)
        return job if job["state"] in TERMINAL else None


class PromptBatch:
    """Submits up to MAX_BATCH prompts at once: one statement, all or none, 202 at once."""

    def __init__(self, pool: ConnectionPool[DictConnection], settings: Settings) -> None:
        self._pool = pool
        self._max_chars = settings.max_prompt_chars
        self._max_queued = settings.org_max_queued
        self._routes = settings.routes
        self._budgets = settings.budgets

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Writes every prompt and its queued job; answers 202 with their ids in input order.

        One Idempotency-Key covers the batch: a repeat answers the original ids with
        `Idempotent-Replayed: true` and writes nothing, past the org's budget too.
        """
        key = parse_idempotency_key(req.get_header(IDEMPOTENCY_KEY_HEADER))
        requests = parse_batch(req.get_media(), self._max_chars)
        check_routable(requests, self._routes, batch=True)
        items = [Submission(text=r.text, parent_id=r.parent_id, priority=r.priority,
                            max_attempts=r.max_attempts, options=r.options, run_at=r.run_at,
                            delay_seconds=r.delay_seconds)
                 for r in requests]
        done = enqueue_many(self._pool, req.context.caller, items, idempotency_key=key,
                            max_queued=self._max_queued, budgets=self._budgets)
        resp.status = falcon.HTTP_202
        if done[0].replayed:
            resp.set_header(REPLAYED_HEADER, "true")
        resp.media = {"items": [{"prompt_id": d.prompt_id, "job_id": d.job_id, "state": d.state}
                                for d in done]}


class PromptItem:
    """A prompt with its response (if any) and a page of its jobs, newest first."""

    def __init__(self, pool: ConnectionPool[DictConnection], settings: Settings) -> None:
        self._pool = pool
        self._max_bytes = settings.page_max_bytes

    def on_get(self, req: falcon.Request, resp: falcon.Response, prompt_id: uuid.UUID) -> None:
        """Answers the prompt, or 404 when it is not the caller's org's; `next_cursor` (with
        `has_more`) continues with its older jobs."""
        page = JobsPage(limit=parse_limit(req, JOBS_LIMIT), max_bytes=self._max_bytes,
                        before=parse_jobs_cursor(req.get_param(JOBS_CURSOR.name)))
        found = get_prompt(self._pool, req.context.caller, prompt_id, page)
        after = found["next_cursor"]
        resp.media = {**found, "next_cursor": None if after is None else encode_jobs_cursor(*after)}
