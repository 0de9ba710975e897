"""GET /jobs/{id}."""

from __future__ import annotations

import uuid

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from service.lookup import get_job

__all__ = ["JobItem"]


class JobItem:
    """One job, as its owner's org sees it."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_get(self, req: falcon.Request, resp: falcon.Response, job_id: uuid.UUID) -> None:
        """Answers the job, or 404 when it is not the caller's org's."""
        resp.media = get_job(self._pool, req.context.caller, job_id)
