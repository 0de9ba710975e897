"""POST /jobs/{id}/cancel and POST /prompts/{id}/retry."""

from __future__ import annotations

import uuid

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.budget import Budgets
from jobqueue.core.db import DictConnection
from jobqueue.engine.control import cancel_job, retry_prompt
from jobqueue.engine.spend import check_budget
from service.auth import API_PREFIX
from service.contract import read_no_body

__all__ = ["JobCancel", "PromptRetry"]


class JobCancel:
    """Cancels a queued or running job: 200 with the job, 409 when already terminal."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_post(self, req: falcon.Request, resp: falcon.Response, job_id: uuid.UUID) -> None:
        """Answers the cancelled job, or 404 when it is not the caller's org's."""
        read_no_body(req)
        caller = req.context.caller
        resp.media = cancel_job(self._pool, job_id, caller.org_id,
                                reason=f"cancelled by user {caller.user_id}")


class PromptRetry:
    """Retries a prompt's latest job: 202 with the new job that supersedes it."""

    def __init__(self, pool: ConnectionPool[DictConnection], max_queued: int = 0,
                 budgets: Budgets | None = None) -> None:
        self._pool = pool
        self._max_queued = max_queued
        self._budgets = budgets or Budgets()

    def on_post(self, req: falcon.Request, resp: falcon.Response, prompt_id: uuid.UUID) -> None:
        """Queues the new job (and re-arms its chain); 409 while the latest job is still active,
        404 for unknown prompts, 429 when the org's queue cap would be passed or its budget is
        spent."""
        read_no_body(req)
        check_budget(self._pool, req.context.caller.org_id, self._budgets)
        retried = retry_prompt(self._pool, prompt_id, req.context.caller,
                               max_queued=self._max_queued)
        resp.status = falcon.HTTP_202
        resp.location = f"{req.root_path}{API_PREFIX}/jobs/{retried.job_id}"
        resp.media = retried.as_dict()
