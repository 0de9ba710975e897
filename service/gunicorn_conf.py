"""gunicorn settings for the web process (`gunicorn -c python:service.gunicorn_conf`, as the Procfile's
`web:` line, the systemd unit and `sa-core dev` run it); configured by environment."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import structlog
from gunicorn.glogging import Logger

from jobqueue.core.logs import configure_logging
from jobqueue.runtime.collector import settle_collector

__all__ = [
    "JsonLogger",
    "accesslog",
    "bind",
    "child_exit",
    "control_socket_disable",
    "graceful_timeout",
    "keepalive",
    "logger_class",
    "on_exit",
    "on_starting",
    "post_worker_init",
    "threads",
    "worker_class",
    "worker_connections",
    "workers",
]

# NOTE: PaaS platforms hand the port in $PORT; 0.0.0.0 so the router (or a container host) can reach it.
bind = f"0.0.0.0:{os.environ.get('PORT', '8000')}"

# NOTE: gevent, so that an open SSE stream costs a greenlet (a few KiB), not a thread: one process
# holds `worker_connections` connections at once (streams and ordinary requests together). The
# sync worker kills long responses at `timeout` and serves one request at a time; gthread ties up
# one OS thread per open stream and queues every new request once `threads` streams are open.
# The worker monkey-patches the stdlib before it imports the app, so psycopg picks its
# gevent-aware wait (gevent's select.poll) and a query waiting on Postgres yields to the other
# greenlets; the pool's and the SSE hub's threads become greenlets. A test holds 100 streams open
# and a database call blocked while POST /prompt still answers (tests/test_sse.py).
worker_class = os.environ.get("SA_WEB_WORKER_CLASS", "gevent")
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
worker_connections = int(os.environ.get("SA_WEB_CONNECTIONS", "1000"))
# NOTE: only used with SA_WEB_WORKER_CLASS=gthread.
threads = int(os.environ.get("SA_WEB_THREADS", "8"))

# NOTE: gunicorn >= 25.1 opens a control socket at one fixed path per user ($XDG_RUNTIME_DIR or
# ~/.gunicorn/gunicorn.ctl), so a second instance on the machine (tests, benchmarks, `sa-core dev`
# next to a Procfile run) collides with the first. Nothing here uses `gunicornc`.
control_socket_disable = True

# NOTE: off (gunicorn's default, pinned here on purpose): the app logs every request itself
# (`http.request`, with its request id and org). `--access-logfile -` (or GUNICORN_CMD_ARGS) turns
# gunicorn's own on, as JSON lines (`http.access`) like everything else.
accesslog = None


class JsonLogger(Logger):  # type: ignore[misc]  # NOTE: gunicorn ships no type hints.
    """gunicorn's logger, rendered into the one JSON log stream (jobqueue/core/logs.py).

    gunicorn's error log (boot, worker exits, timeouts) goes through the stdlib root logger, so it
    is filtered by LOG_LEVEL (gunicorn's --log-level is not used); the access log, when enabled,
    is one structured line per request, without the query string (it may carry an access_token).
    """

    def setup(self, cfg: Any) -> None:
        """Replaces gunicorn's text handlers by the root logger's JSON one."""
        self.cfg = cfg
        self._access_log_enabled = cfg.accesslog is not None
        # NOTE: unbuffered, so that no log thread exists when a gevent worker patches the stdlib
        # (LineLogger).
        configure_logging(buffered=False)
        for log in (self.error_log, self.access_log):
            for handler in list(log.handlers):
                log.removeHandler(handler)
            log.propagate = True
            log.setLevel(logging.NOTSET)

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        """Logs one request as `http.access`."""
        if not self._access_log_enabled:
            return
        atoms = self.atoms(resp, req, environ, request_time)
        structlog.get_logger("gunicorn.access").info(
            "http.access", method=atoms["m"], path=atoms["U"], status=atoms["s"], bytes=atoms["B"],
            duration_ms=round(request_time.total_seconds() * 1000, 3), remote_addr=atoms["h"],
            user_agent=atoms["a"])


logger_class = JsonLogger

# NOTE: gunicorn's default, pinned on purpose: besides idle keep-alive connections, it bounds (in
# the gevent worker) the wait for a request's headers and the discarding of a body the app did not
# read (a 401, a 408), so a client that stalls there holds its connection slot 2 s at most. The
# body itself is bounded by SA_BODY_TIMEOUT (service/middleware_security.py).
keepalive = 2

# NOTE: on SIGTERM, in-flight requests get 30 s to finish, the same budget the worker process gets
# (SA_SHUTDOWN_GRACE defaults to 30).
graceful_timeout = 30


# NOTE: several web processes answer /metrics in turn, so their figures must be pooled: without
# PROMETHEUS_MULTIPROC_DIR each scrape would see only the process that happened to answer it
# (jobqueue/core/exposition.py). Set here, in the master, before any worker imports prometheus_client;
# a fresh directory per run (removed on exit) unless the operator names one (ops/systemd/).
_OWN_MULTIPROC_DIR: str | None = None
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    _OWN_MULTIPROC_DIR = tempfile.mkdtemp(prefix="sa-core-prometheus-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _OWN_MULTIPROC_DIR


def on_exit(server: Any) -> None:
    """Removes the multiprocess directory this configuration created (never one it was given)."""
    if _OWN_MULTIPROC_DIR:
        shutil.rmtree(_OWN_MULTIPROC_DIR, ignore_errors=True)


_BOOT_ERROR = 3
"""The exit code gunicorn gives a worker that failed to boot (service/app.py uses it too)."""


def _refusal_from_a_child() -> str | None:
    """Reads the settings and checks the database in a forked child, whose imports die with it.

    NOTE: the master must not import psycopg (jobqueue/core/logs.py says why), yet a setting
    that is wrong or a database that refuses for good should stop the web with one line before
    any worker boots (each would log it, then gunicorn its own lines); a server that is down is
    left to the workers' pools, which wait for it.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        message = ""
        try:
            from jobqueue.core.dbcheck import DatabaseRefused, check_urls
            from jobqueue.core.settings import Settings, SettingsError

            try:
                settings = Settings.from_env()
                check_urls({"DATABASE_URL": settings.database_url,
                            **({"SA_DIRECT_DATABASE_URL": settings.direct_database_url}
                               if settings.listen else {})})
            except (SettingsError, DatabaseRefused) as exc:
                message = str(exc)
        finally:
            os.write(write, message.encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        said = answer.read().decode()
    os.waitpid(pid, 0)
    return said or None


def on_starting(server: Any) -> None:
    """Stops at once (exit 3, one line) on a setting or database refusal retrying cannot fix; empties
    PROMETHEUS_MULTIPROC_DIR (when set) so counters from a previous run do not leak in."""
    if (refused := _refusal_from_a_child()) is not None:
        structlog.get_logger(__name__).error("web.cannot_start", reason=refused)
        on_exit(server)  # NOTE: gunicorn calls it only after a start.
        raise SystemExit(_BOOT_ERROR)
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()


def post_worker_init(worker: Any) -> None:
    """Ends the worker's SSE streams as soon as it gets SIGTERM, before gunicorn's graceful wait,
    and settles the collector once the app is built (jobqueue/runtime/collector.py).

    Streams never finish by themselves, so without this every graceful stop or restart would
    wait the whole `graceful_timeout`; clients reconnect (to a live worker) with Last-Event-ID.
    """
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        from service.events.hub import close_all_streams

        close_all_streams()
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.siginterrupt(signal.SIGTERM, False)
    settle_collector()


def child_exit(server: Any, worker: Any) -> None:
    """Tells prometheus-client's multiprocess mode that a web worker died, so its live gauges go."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]
