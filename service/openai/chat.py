"""POST /openai/v1/chat/completions: the request becomes a prompt and a durable job.

Not streamed, the answer is held until the job ends (at most SA_OPENAI_MAX_WAIT, and never past
the client's own read timeout): 200 `chat.completion`, or the job's failure in OpenAI's error
shape. A job that outlives the hold answers 409 `job_in_progress` naming the job; with an
Idempotency-Key the answer tells the SDK to retry at once (`x-should-retry: true`), and the retry
attaches to the same job instead of paying twice; without one it tells it not to (the job still
finishes, and X-SA-Job-Id finds it). Streamed, the answer is `chat.completion.chunk` events.
Every answer names its job in X-SA-Job-Id.
"""

from __future__ import annotations

import time
import uuid

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.chat import ChatInvalid, ChatRequest, parse_chat
from jobqueue.core.db import DictConnection
from jobqueue.core.errors import IdempotencyKeyReused
from jobqueue.core.fallback import named_serving, serves
from jobqueue.core.openai_wire import Body, chat_completion, job_answer, job_failure
from jobqueue.core.settings import Settings
from jobqueue.core.states import TERMINAL
from jobqueue.core.tokens import Caller
from jobqueue.engine.enqueue import Enqueued, enqueue
from service.events.hub import EventHub
from service.openai.errors import OpenAIError, bad_request
from service.openai.follow import JobFollowers
from service.openai.stream import ChatStream, StreamPlan, TextTracker, await_first, frames
from service.openai.waits import (
    CLIENT_TIMEOUT_HEADER,
    Slot,
    WaitGate,
    hold_seconds,
    read_answer,
    wait_for_end,
)
from service.parsers import parse_idempotency_key
from service.resources.prompts import IDEMPOTENCY_KEY_HEADER, REPLAYED_HEADER
from service.waits import Waits

__all__ = ["JOB_HEADER", "ChatCompletions"]

JOB_HEADER = "X-SA-Job-Id"
"""The job behind a chat answer (GET /sa-core/v1/jobs/{id}, the mission page, the console)."""

_INTERACTIVE_PRIORITY = 50


class ChatCompletions:
    """Runs an OpenAI chat completion as a durable job and answers as OpenAI does."""

    def __init__(self, pool: ConnectionPool[DictConnection], settings: Settings, hub: EventHub,
                 gate: WaitGate, waits: Waits) -> None:
        self._pool = pool
        self._hub = hub
        self._followers = JobFollowers(hub)
        self._gate = gate
        self._waits = waits
        self._settings = settings
        self._routes = settings.routes

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Enqueues the request's job, then answers when it ends (or streams it).

        Raises:
            OpenAIError: 400 for a request sa-core cannot run as given, 404 for a model no route
                serves, 429 when too many requests are held open, the job's failure, or 409
                when it outlives the hold.
        """
        key = parse_idempotency_key(req.get_header(IDEMPOTENCY_KEY_HEADER))
        try:
            request = parse_chat(req.get_media(default_when_empty=None),
                                 self._settings.max_prompt_chars)
        except ChatInvalid as exc:
            raise bad_request(exc.message, exc.param, exc.code) from None
        if self._routes and self._routes.for_model(request.model) is None:
            raise OpenAIError(404, f"The model `{request.model}` does not exist or no route "
                              f"serves it (known: {', '.join(self._routes.known_models)}).",
                              code="model_not_found", param="model")
        prefer = request.options.get("prefer_provider")
        if self._routes and prefer is not None and named_serving(
                self._routes, prefer, request.model) is None:
            serving = [r.name for r in self._routes.routes if serves(r, request.model)]
            raise bad_request(f"No route `{prefer}` serves the model `{request.model}` (known "
                              f"routes serving it: {', '.join(serving)}).", "prefer_provider")
        caller: Caller = req.context.caller
        slot = self._admit(caller, req.context.token_digest)
        try:
            done = self._enqueue(caller, request, key)
            resp.set_header(JOB_HEADER, str(done.job_id))
            if done.replayed:
                resp.set_header(REPLAYED_HEADER, "true")
            seconds = hold_seconds(self._settings.openai_max_wait,
                                   req.get_header(CLIENT_TIMEOUT_HEADER))
            if request.stream:
                self._stream(resp, caller, done.job_id, request, seconds, slot, key)
                return
            # NOTE: past the web's shared wait caps the job is not held: read once, answered
            # like one that outlived its hold (409 job_in_progress, re-attached by its key).
            with self._waits.admit(req.context.token_digest) as shared:
                row = wait_for_end(self._pool, self._hub, caller, done.job_id,
                                   seconds if shared is not None else 0.0)
        except BaseException:
            slot.release()
            raise
        slot.release()
        self._answer(resp, row, done.job_id, seconds, key)

    def _admit(self, caller: Caller, token: bytes) -> Slot:
        slot = self._gate.admit(caller, token)
        if slot is None:
            raise OpenAIError(429, "too many chat requests are held open (SA_OPENAI_MAX_WAITING, "
                              "SA_OPENAI_MAX_WAITING_PER_TOKEN); retry shortly",
                              "rate_limit_error", "too_many_waiting", headers={"Retry-After": "1"})
        return slot

    def _enqueue(self, caller: Caller, request: ChatRequest, key: str | None) -> Enqueued:
        # NOTE: the budget is checked by the enqueue after the key, so a retry of a request
        # already queued re-attaches to its job even once the org's budget is spent.
        try:
            return enqueue(self._pool, caller, request.text, priority=_INTERACTIVE_PRIORITY,
                           options=request.options, idempotency_key=key,
                           max_queued=self._settings.org_max_queued,
                           budgets=self._settings.budgets)
        except IdempotencyKeyReused as exc:
            raise OpenAIError(409, exc.description, code="idempotency_key_reused") from None

    def _answer(self, resp: falcon.Response, row: Body, job_id: uuid.UUID,
                seconds: float, key: str | None) -> None:
        headers = {JOB_HEADER: str(job_id), "x-should-retry": "false"}
        if row["state"] not in TERMINAL:
            if key is not None:
                # NOTE: the SDK's retry carries the same key, so it attaches to this job.
                headers.update({"x-should-retry": "true", "retry-after-ms": "1"})
            raise OpenAIError(
                409, f"sa-core job {job_id} is still {row['state']} after {seconds:g} s; it "
                     "goes on. " + ("Send the request again with the same Idempotency-Key to "
                                    "wait for it again." if key is not None else
                                    "Send an Idempotency-Key to re-attach to a job; "
                                    f"GET /sa-core/v1/jobs/{job_id} shows this one."),
                code="job_in_progress", headers=headers)
        answer = job_answer(row)
        if row["state"] != "succeeded":
            status, body = job_failure(answer)
            raise OpenAIError(status, str(body["error"]["message"]), headers=headers, body=body)
        resp.media = chat_completion(answer)

    def _stream(self, resp: falcon.Response, caller: Caller, job_id: uuid.UUID,
                request: ChatRequest, seconds: float, slot: Slot, key: str | None) -> None:
        sub = self._followers.follow(job_id)

        def close() -> None:
            self._followers.unfollow(job_id, sub)
            slot.release()

        settings = self._settings
        plan = StreamPlan(self._pool, caller, request.include_usage, settings.sse_keepalive,
                          time.monotonic() + settings.openai_stream_max)
        try:
            row = read_answer(self._pool, caller, job_id)
            tracker = TextTracker(row["attempt"], row["partial_text"])
            row = await_first(sub, tracker, plan, row, seconds)
            if row["state"] in TERMINAL and row["state"] != "succeeded":
                self._answer(resp, row, job_id, seconds, key)
        except BaseException:
            self._followers.unfollow(job_id, sub)
            raise
        resp.content_type = "text/event-stream; charset=utf-8"
        resp.cache_control = ["no-cache"]
        resp.set_header("X-Accel-Buffering", "no")
        resp.stream = ChatStream(frames(sub, tracker, plan, row), close)
