"""Prometheus exposition: the web's /metrics page and the worker's own metrics port.

Web (gunicorn, several processes): with `PROMETHEUS_MULTIPROC_DIR` set (service/gunicorn_conf.py
sets it), every process writes its counters and histograms to files in that directory, and each
scrape aggregates all of them with a fresh registry and `MultiProcessCollector`, whichever
process answers. Queue depth and the oldest queued job's age are not process figures: they are
read from the database at scrape time (`JOB_QUEUE_DEPTH`, index-only on the partial indexes) and
put into that scrape's registry.

Worker: each `sa-core run-worker` process serves its own registry on `SA_METRICS_PORT` (a
separate scrape target per worker process, so it works across machines, and `up` says whether
the worker is alive). Workers must not share the web's multiprocess directory: the web would
then report their figures too, and Prometheus would count them twice. A worker's page leaves out
the families only the web produces (metrics.WEB_ONLY), and the web's those only a worker does.

Process figures (job slots, pool statistics, open streams) are set by `ProcessFigures` from
their owner's state: before each scrape a process answers, and in the web every few seconds as
well, so that the processes a scrape does not reach keep their files current.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
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
    "ProcessFigures",
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


class ProcessFigures:
    """Sets this process's operational gauges from the objects that hold the figures.

    Each source is a function that sets its gauges (cheap, no I/O). `refresh()` runs them all;
    `start(interval)` runs them from a daemon thread (a greenlet under gevent) every `interval`.
    """

    def __init__(self) -> None:
        self._sources: list[Callable[[], None]] = []

    def add(self, source: Callable[[], None]) -> ProcessFigures:
        """Adds a source; returns self."""
        self._sources.append(source)
        return self

    def add_pool(self, pool: ConnectionPool[DictConnection]) -> ProcessFigures:
        """Adds a pool's `get_stats()`: connections open, idle and max, and callers waiting."""
        name = pool.name

        def read() -> None:
            stats = pool.get_stats()
            metrics.DB_POOL_CONNECTIONS.labels(pool=name, state="open").set(stats.get("pool_size", 0))
            metrics.DB_POOL_CONNECTIONS.labels(pool=name, state="idle").set(stats.get("pool_available", 0))
            metrics.DB_POOL_CONNECTIONS.labels(pool=name, state="max").set(stats.get("pool_max", 0))
            metrics.DB_POOL_REQUESTS_WAITING.labels(pool=name).set(stats.get("requests_waiting", 0))

        return self.add(read)

    def refresh(self) -> None:
        """Runs every source; one that fails is logged and the others still run."""
        for source in self._sources:
            try:
                source()
            except Exception:  # NOTE: a figure is never worth a failed scrape or a dead thread.
                log.exception("metrics.figure_failed", source=getattr(source, "__qualname__", "?"))

    def start(self, interval: float) -> ProcessFigures:
        """Refreshes every `interval` seconds from a daemon thread; returns self."""

        def loop() -> None:
            while True:
                self.refresh()
                stop.wait(interval)

        stop = threading.Event()
        threading.Thread(target=loop, name="sa-process-figures", daemon=True).start()
        return self


class _Forward:
    """A collector that yields another registry's (or collector's) metrics, minus some names,
    after running `before` (a refresh of the figures it forwards)."""

    def __init__(self, source: Collector, without: frozenset[str] = frozenset(),
                 before: Callable[[], None] | None = None) -> None:
        self._source = source
        self._without = without
        self._before = before

    def collect(self) -> Iterable[Metric]:
        if self._before is not None:
            self._before()
        return (m for m in self._source.collect() if m.name not in self._without)


def render_metrics(pool: ConnectionPool[DictConnection], figures: ProcessFigures | None = None) -> bytes:
    """Renders the web's /metrics page: every process's metrics plus the queue read from the database.

    `figures`, when given, is refreshed first, so this process's own figures are current.

    When the database does not answer, the page still carries the process metrics; the two
    scrape-time gauges are left out (alert on their absence) and the failure is logged.

    Returns:
        The page, in Prometheus text format (`CONTENT_TYPE`).
    """
    if figures is not None:
        figures.refresh()
    registry = CollectorRegistry(auto_describe=False)
    if multiprocess_dir():
        # NOTE: the scrape-time gauges also land in the multiprocess files of whichever process
        # set them last; only this scrape's fresh values are kept, so each name appears once.
        collector = prometheus_multiprocess.MultiProcessCollector(None)  # type: ignore[no-untyped-call]
        registry.register(_Forward(collector, _SCRAPE_TIME_NAMES | metrics.WORKER_ONLY))
    else:
        registry.register(_Forward(REGISTRY, metrics.WORKER_ONLY))
    try:
        queue: QueueFigures | None = read_queue_figures(pool)
    except (psycopg.Error, PoolTimeout) as exc:
        log.warning("metrics.queue_unavailable", error_type=type(exc).__name__, error=str(exc).strip())
        queue = None
    with _SCRAPE_LOCK:
        if queue is not None:
            metrics.QUEUE_DEPTH.labels(state="queued").set(queue.queued)
            metrics.QUEUE_DEPTH.labels(state="running").set(queue.running)
            metrics.OLDEST_QUEUED_SECONDS.set(queue.oldest_queued_seconds)
            registry.register(metrics.QUEUE_DEPTH)
            registry.register(metrics.OLDEST_QUEUED_SECONDS)
        return generate_latest(registry)


def start_worker_metrics_server(port: int, addr: str = "0.0.0.0",
                                figures: ProcessFigures | None = None) -> WSGIServer:
    """Serves this worker process's metrics on `addr:port` from a daemon thread.

    Args:
        port: TCP port (`SA_METRICS_PORT`).
        addr: address to bind.
        figures: refreshed before each scrape (job slots, the pool).

    Returns:
        The server; `shutdown()` stops it.

    Raises:
        OSError: the port is taken.
    """
    if multiprocess_dir():
        # NOTE: see the module docstring: the web's /metrics would report this worker too.
        log.warning("metrics.worker_in_multiprocess_dir", directory=multiprocess_dir(),
                    hint="unset PROMETHEUS_MULTIPROC_DIR for workers")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Forward(REGISTRY, metrics.WEB_ONLY, figures.refresh if figures else None))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    log.info("metrics.serving", port=port, addr=addr)
    return server
