"""One worker assembly: a worker and everything it runs with, wired from settings in one place.

`sa-core run-worker`, the tests' worker harness and the benchmarks all build their workers here,
so a collaborator added to the worker is added once. The caller may lend a pool or providers
(tests share one fake provider between workers; a benchmark swaps in a stub); what the assembly
opened itself, it closes.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.listener import NotificationListener
from jobqueue.core.policy import BackoffConfig
from jobqueue.core.queries.job_event import JOB_QUEUED_LISTEN
from jobqueue.core.settings import Settings
from jobqueue.engine.finalize import FinishRules
from jobqueue.runtime.completer import Completer
from jobqueue.runtime.executor import Executor
from jobqueue.runtime.gate import RouteGate
from jobqueue.runtime.provider import RoutedProviders
from jobqueue.runtime.streaming import DeltaWriter
from jobqueue.runtime.worker import Worker
from jobqueue.runtime.worker_config import WorkerConfig

__all__ = ["AssembledWorker", "assemble_worker", "open_descriptors", "worker_config"]

# NOTE: job slots never hold a connection: the two claim loops, the heartbeat, the completer and
# the delta writer each borrow one for a statement, whatever the concurrency.
_POOL_SIZE = 6
# NOTE: descriptors a worker holds besides its slots' provider sockets (database sessions, the
# hub, logs, the metrics server), with room to spare.
_SPARE_DESCRIPTORS = 100


def open_descriptors(concurrency: int) -> tuple[int, int]:
    """Raises the process's soft descriptor limit to its hard one; returns both.

    Each job slot holds a provider socket of its own, so a worker past the soft limit (often
    1,024) fails calls with EMFILE while the hard limit would have let it run. Logs a warning
    when even the hard limit leaves too few for `concurrency`: more processes are the way past.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    if concurrency + _SPARE_DESCRIPTORS > soft:
        structlog.get_logger(__name__).warning(
            "worker.descriptors_short", concurrency=concurrency, limit=soft, hard_limit=hard,
            hint="each slot holds a provider connection: lower --concurrency and run more "
                 "worker processes, or raise the hard limit (LimitNOFILE= in the unit)")
    return soft, hard


def worker_config(settings: Settings, **overrides: Any) -> WorkerConfig:
    """The WorkerConfig the settings describe (poll, heartbeat, cancel check, grace, caps), with
    `overrides`."""
    return replace(WorkerConfig(
        org_max_running=settings.org_max_running, priority_aging=settings.priority_aging,
        token_window=settings.route_limit_window if settings.fair_by_tokens else 0.0,
        poll_interval=settings.poll_interval, heartbeat_interval=settings.heartbeat_interval,
        cancel_check_interval=settings.cancel_check_interval,
        shutdown_grace=settings.shutdown_grace, budgets=settings.budgets,
    ), **overrides)


@dataclass
class AssembledWorker:
    """A worker with its pool, providers, completer and delta writer; `close()` releases what it
    owns."""

    worker: Worker
    pool: ConnectionPool[DictConnection]
    providers: RoutedProviders
    completer: Completer
    deltas: DeltaWriter
    owns_pool: bool
    owns_providers: bool
    listeners: list[NotificationListener] = field(default_factory=list)

    def listen(self, conninfo: str) -> NotificationListener:
        """Starts the wake-up listener (`sa_job_queued`) on a direct connection to `conninfo`."""
        listener = NotificationListener(conninfo, JOB_QUEUED_LISTEN, self.worker.on_job_queued,
                                        self.worker.wake).start()
        self.listeners.append(listener)
        return listener

    def close(self) -> None:
        """Stops the listeners, the completer and the delta writer, then closes what the assembly
        opened."""
        for listener in self.listeners:
            listener.stop()
        self.completer.close()
        self.deltas.close()
        if self.owns_providers:
            self.providers.close()
        if self.owns_pool:
            self.pool.close()


def assemble_worker(
    settings: Settings,
    config: WorkerConfig,
    *,
    pool: ConnectionPool[DictConnection] | None = None,
    providers: RoutedProviders | None = None,
    worker_id: str | None = None,
) -> AssembledWorker:
    """Wires a worker from `settings`.

    Args:
        settings: the process's settings (routes, timeouts, backoff, throttling, streaming).
        config: how much the worker runs at once and how often it polls (`worker_config`).
        pool: a pool to use instead of opening one on SA's worker URL (not closed by `close`).
        providers: providers to use instead of building them from the routes (not closed).
        worker_id: the worker's claim; a fresh one by default.

    Raises:
        ValueError: the routes cannot be built (the message hides passwords).
        psycopg_pool.PoolTimeout: the database did not answer in time.
    """
    built = providers or RoutedProviders.build(
        settings.routes, settings.provider_timeout, settings.provider_max_response_bytes,
        settings.provider_connect_timeout, settings.provider_read_timeout,
        settings.provider_source_addresses)
    try:
        opened = pool or open_pool(settings.worker_database_url, name="worker",
                                   max_size=_POOL_SIZE, prepare=settings.prepared_statements)
    except BaseException:
        if providers is None:
            built.close()
        raise
    backoff = BackoffConfig(base=settings.backoff_base, cap=settings.backoff_cap,
                            rate_limit_min_wait=settings.rate_limit_min_wait)
    completer = Completer(opened, FinishRules(backoff))
    deltas = DeltaWriter(opened, settings.stream_interval)
    executor = Executor(
        completer=completer, providers=built, backoff=backoff,
        gate=RouteGate(opened, refresh=settings.gate_refresh, window=settings.route_limit_window,
                       reserve_tokens=settings.token_reservations,
                       use_headers=settings.ratelimit_headers,
                       fair_by_tokens=settings.fair_by_tokens),
        throttle_max_wait=settings.throttle_max_wait, deltas=deltas,
        fallback_after=settings.fallback_after)
    return AssembledWorker(Worker(opened, executor, config, worker_id), opened, built, completer,
                           deltas, owns_pool=pool is None, owns_providers=providers is None)
