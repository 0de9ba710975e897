"""Prometheus exposition: the web's /metrics page and the worker's own metrics port.

Web (gunicorn, several processes): with `PROMETHEUS_MULTIPROC_DIR` set (ops/gunicorn.conf.py
sets it), every process writes its counters and histograms to files in that directory, and each
scrape aggregates all of them with a fresh registry and `MultiProcessCollector`, whichever
process answers. Queue depth and the oldest queued job's age are not process figures: they are
read from the database at scrape time (`JOB_QUEUE_DEPTH`, index-only on the partial indexes) and
put into that scrape's registry.

Worker: each `sa-core run-worker` process serves its own registry on `SA_METRICS_PORT` (a
separate scrape target per worker process, so it works across machines, and `up` says whether
the worker is alive). Workers must not share the web's multiprocess directory: the web would
then report their figures too, and Prometheus would count them twice.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

import psycopg
import structlog
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    start_http_server,
)
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from psycopg_pool import ConnectionPool, PoolTimeout

from jobqueue.core import metrics
from jobqueue.core.db import DictConnection
from jobqueue.core.queries import job as job_q
from jobqueue.core.queries import maintenance as maintenance_q
from jobqueue.core.queries import metrics as q

__all__ = [
    "CONTENT_TYPE",
    "QueueFigures",
    "multiprocess_dir",
    "read_queue_figures",
    "render_metrics",
    "start_worker_metrics_server",
]

# NOTE: generate_latest() writes the classic text format (0.0.4); say so, since prometheus-client's
# CONTENT_TYPE_LATEST now names version 1.0.0, which older Prometheus servers do not know.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# NOTE: a scrape must answer even when the database is slow: a late figure is worth less than
# the process metrics around it.
_SCRAPE_TIMEOUT_S = 2.0

# NOTE: the scrape-time gauges are set and rendered under one lock, so two threads scraping at
# once cannot interleave one's figures with the other's.
_SCRAPE_LOCK = threading.Lock()
_SCRAPE_TIME_NAMES = frozenset({"sa_job_queue_depth", "sa_job_oldest_queued_seconds"})

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class QueueFigures:
    """What the database says about the queue right now."""

    queued: int
    running: int
    oldest_queued_seconds: float


def multiprocess_dir() -> str | None:
    """Returns the prometheus-client multiprocess directory of this process, if any."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def read_queue_figures(pool: ConnectionPool[DictConnection]) -> QueueFigures:
    """Reads queue depth (queued, running) and the oldest claimable job's age, from partial indexes.

    Raises:
        psycopg.Error, psycopg_pool.PoolTimeout: the database did not answer in time.
    """
    timeout = {"timeout_ms": str(int(_SCRAPE_TIMEOUT_S * 1000))}
    with pool.connection(timeout=_SCRAPE_TIMEOUT_S) as conn, conn.transaction():
        conn.execute(maintenance_q.MAINTENANCE_SET_STATEMENT_TIMEOUT, timeout)
        conn.execute(job_q.JOB_PLAN_SETTINGS)
        row = conn.execute(q.JOB_QUEUE_DEPTH).fetchone()
    assert row is not None
    return QueueFigures(queued=row["queued"], running=row["running"],
                        oldest_queued_seconds=row["oldest_queued_seconds"])


class _Forward:
    """A collector that yields another registry's (or collector's) metrics, minus some names."""

    def __init__(self, source: Collector, without: frozenset[str] = frozenset()) -> None:
        self._source = source
        self._without = without

    def collect(self) -> Iterable[Metric]:
        return (m for m in self._source.collect() if m.name not in self._without)


def render_metrics(pool: ConnectionPool[DictConnection]) -> bytes:
    """Renders the web's /metrics page: every process's metrics plus the queue read from the database.

    When the database does not answer, the page still carries the process metrics; the two
    scrape-time gauges are left out (alert on their absence) and the failure is logged.

    Returns:
        The page, in Prometheus text format (`CONTENT_TYPE`).
    """
    registry = CollectorRegistry(auto_describe=False)
    if multiprocess_dir():
        # NOTE: the scrape-time gauges also land in the multiprocess files of whichever process
        # set them last; only this scrape's fresh values are kept, so each name appears once.
        collector = prometheus_multiprocess.MultiProcessCollector(None)  # type: ignore[no-untyped-call]
        registry.register(_Forward(collector, _SCRAPE_TIME_NAMES))
    else:
        registry.register(_Forward(REGISTRY))
    try:
        figures: QueueFigures | None = read_queue_figures(pool)
    except (psycopg.Error, PoolTimeout) as exc:
        log.warning("metrics.queue_unavailable", error_type=type(exc).__name__, error=str(exc).strip())
        figures = None
    with _SCRAPE_LOCK:
        if figures is not None:
            metrics.QUEUE_DEPTH.labels(state="queued").set(figures.queued)
            metrics.QUEUE_DEPTH.labels(state="running").set(figures.running)
            metrics.OLDEST_QUEUED_SECONDS.set(figures.oldest_queued_seconds)
            registry.register(metrics.QUEUE_DEPTH)
            registry.register(metrics.OLDEST_QUEUED_SECONDS)
        return generate_latest(registry)


def start_worker_metrics_server(port: int, addr: str = "0.0.0.0") -> WSGIServer:
    """Serves this worker process's metrics on `addr:port` from a daemon thread.

    Args:
        port: TCP port (`SA_METRICS_PORT`).
        addr: address to bind.

    Returns:
        The server; `shutdown()` stops it.

    Raises:
        OSError: the port is taken.
    """
    if multiprocess_dir():
        # NOTE: see the module docstring: the web's /metrics would report this worker too.
        log.warning("metrics.worker_in_multiprocess_dir", directory=multiprocess_dir(),
                    hint="unset PROMETHEUS_MULTIPROC_DIR for workers")
    server, _thread = start_http_server(port, addr=addr)
    log.info("metrics.serving", port=port, addr=addr)
    return server
