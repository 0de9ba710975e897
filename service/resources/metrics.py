"""GET /metrics: Prometheus text format, unscoped (no token), as the contract says (docs/architecture.md)."""

from __future__ import annotations

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.exposition import CONTENT_TYPE, ProcessFigures, render_metrics

__all__ = ["Metrics"]


class Metrics:
    """Every web process's metrics, plus queue depth and oldest queued age read at scrape time."""

    def __init__(self, pool: ConnectionPool[DictConnection], figures: ProcessFigures | None = None) -> None:
        self._pool = pool
        self._figures = figures

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers the page; it stays 200 (without the queue gauges) when the database is down."""
        resp.content_type = CONTENT_TYPE
        resp.data = render_metrics(self._pool, self._figures)
