"""POST /prompt and GET /prompts/{id}."""

from __future__ import annotations

import uuid

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.db import DictConnection
from jobqueue.enqueue import enqueue
from jobqueue.lookup import get_prompt
from service.validation import parse_prompt

__all__ = ["PromptCollection", "PromptItem"]


class PromptCollection:
    """Submits a prompt: 202 at once, the work happens in a worker."""

    def __init__(self, pool: ConnectionPool[DictConnection], max_prompt_chars: int) -> None:
        self._pool = pool
        self._max_chars = max_prompt_chars

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Writes the prompt and its queued job; answers 202 with both ids."""
        request = parse_prompt(req.get_media(), self._max_chars)
        done = enqueue(
            self._pool, req.context.caller, request.text, parent_id=request.parent_id,
            priority=request.priority, max_attempts=request.max_attempts,
            options=request.options,
        )
        resp.status = falcon.HTTP_202
        resp.location = f"{req.root_path}/sa-core/v1/jobs/{done.job_id}"
        resp.media = {"prompt_id": done.prompt_id, "job_id": done.job_id, "state": done.state}


class PromptItem:
    """A prompt with its response (if any) and its jobs, newest first."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_get(self, req: falcon.Request, resp: falcon.Response, prompt_id: uuid.UUID) -> None:
        """Answers the prompt, or 404 when it is not the caller's org's."""
        resp.media = get_prompt(self._pool, req.context.caller, prompt_id)
