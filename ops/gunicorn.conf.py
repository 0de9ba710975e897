"""gunicorn settings for the web process (Procfile `web:` and `sa-core dev`); configured by environment."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = [
    "accesslog",
    "bind",
    "child_exit",
    "control_socket_disable",
    "graceful_timeout",
    "on_starting",
    "threads",
    "worker_class",
    "workers",
]

# NOTE: PaaS platforms hand the port in $PORT; 0.0.0.0 so the router (or a container host) can reach it.
bind = f"0.0.0.0:{os.environ.get('PORT', '8000')}"

# NOTE: gthread, not sync: the sync worker kills long responses (SSE streams) at `timeout` and serves
# one request at a time; gthread serves `threads` requests per process, and database and provider
# calls release the GIL while they wait. Each open SSE stream holds one thread.
worker_class = "gthread"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("SA_WEB_THREADS", "8"))

# NOTE: gunicorn >= 25.1 opens a control socket at one fixed path per user ($XDG_RUNTIME_DIR or
# ~/.gunicorn/gunicorn.ctl), so a second instance on the machine (tests, benchmarks, `sa-core dev`
# next to a Procfile run) collides with the first. Nothing here uses `gunicornc`.
control_socket_disable = True

# NOTE: off (gunicorn's default, pinned here on purpose): stdout carries the app's structlog JSON
# lines, and gunicorn's access log would mix one unstructured text line per request into them.
# Reporting requests is the app's job.
accesslog = None

# NOTE: on SIGTERM, in-flight requests get 30 s to finish, the same budget the worker process gets
# (SA_SHUTDOWN_GRACE defaults to 30).
graceful_timeout = 30


def on_starting(server: Any) -> None:
    """Empties PROMETHEUS_MULTIPROC_DIR (when set) so counters from a previous run do not leak in."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()


def child_exit(server: Any, worker: Any) -> None:
    """Tells prometheus-client's multiprocess mode that a web worker died, so its live gauges go."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
