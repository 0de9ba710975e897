"""Liveness and readiness probes."""

from __future__ import annotations

import falcon
import psycopg
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import health as q

__all__ = ["Health", "Ready"]


class Health:
    """The process answers: nothing else is checked."""

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Always 200."""
        resp.media = {"ok": True}


class Ready:
    """The database answers within a short deadline."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self._pool = pool

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """200 when Postgres answers, else a JSON 503."""
        try:
            with self._pool.connection(timeout=2.0) as conn:
                conn.execute(q.HEALTH_PING)
        except psycopg.OperationalError as exc:
            raise falcon.HTTPServiceUnavailable(
                title="Database unavailable", description=type(exc).__name__
            ) from exc
        resp.media = {"ok": True, "database": "up"}
