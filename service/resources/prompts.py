"""POST /prompt and GET /prompts/{id}."""

from __future__ import annotations

import uuid

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import BearerToken, authenticate
from jobqueue.engine.enqueue import enqueue
from service.auth import invalid_token
from service.lookup import get_prompt
from service.validation import parse_idempotency_key, parse_prompt

__all__ = ["IDEMPOTENCY_KEY_HEADER", "REPLAYED_HEADER", "PromptCollection", "PromptItem"]

IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"


class PromptCollection:
    """Submits a prompt: 202 at once, the work happens in a worker."""

    def __init__(self, pool: ConnectionPool[DictConnection], settings: Settings) -> None:
        self._pool = pool
        self._max_chars = settings.max_prompt_chars
        self._max_queued = settings.org_max_queued

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Writes the prompt and its queued job; answers 202 with both ids.

        With an Idempotency-Key already used for the same request, answers the original ids
        with `Idempotent-Replayed: true` and writes nothing.
        """
        # NOTE: AuthMiddleware leaves the token unchecked on this route (DEFERRED_ROUTES) unless
        # the body is large; the enqueue statement then checks it (InvalidToken answers 401).
        caller = getattr(req.context, "caller", None) or req.context.token
        try:
            key = parse_idempotency_key(req.get_header(IDEMPOTENCY_KEY_HEADER))
            request = parse_prompt(req.get_media(), self._max_chars)
        except falcon.HTTPError:
            # NOTE: a client without a valid token learns nothing about its request: the
            # deferred token is looked up before any 4xx about the body is answered.
            if isinstance(caller, BearerToken) and authenticate(self._pool, caller) is None:
                raise invalid_token() from None
            raise
        done = enqueue(
            self._pool, caller, request.text, parent_id=request.parent_id,
            priority=request.priority, max_attempts=request.max_attempts,
            options=request.options, idempotency_key=key, max_queued=self._max_queued,
        )
        req.context.caller = done.caller
        resp.status = falcon.HTTP_202
        if done.replayed:
            resp.set_header(REPLAYED_HEADER, "true")
        resp.location = f"{req.root_path}/sa-core/v1/jobs/{done.job_id}"
        resp.media = {"prompt_id": done.prompt_id, "job_id": done.job_id, "state": done.state}


class PromptItem:
    """A prompt with its response (if any) and its jobs, newest first."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_get(self, req: falcon.Request, resp: falcon.Response, prompt_id: uuid.UUID) -> None:
        """Answers the prompt, or 404 when it is not the caller's org's."""
        resp.media = get_prompt(self._pool, req.context.caller, prompt_id)
