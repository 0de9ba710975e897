"""Real processes for the tests: the web as the Procfile runs it, any child with its log, its JSON lines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobqueue.core.settings import Settings
from tests.helpers import REPO, answers, free_port, wait_for

__all__ = ["gunicorn", "log_lines", "run_process"]


@contextlib.contextmanager
def gunicorn(settings: Settings, tmp_path: Path, port: int | None = None, **env: str) -> Iterator[str]:
    """Runs the web process exactly as the Procfile does (one gevent worker); yields its base URL.

    A given `port` lets a test start the web again where its clients expect it.
    """
    port = port or free_port()
    log = (tmp_path / f"gunicorn-{port}.log").open("wb")
    web = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "python:service.gunicorn_conf", "service.app:create_app()"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "DATABASE_URL": settings.database_url, "PORT": str(port),
             "WEB_CONCURRENCY": "1", "SA_POLL_INTERVAL": "0.1", **env})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: web.poll() is None and answers(f"{base}/readyz"), timeout=30, interval=0.1)
        yield base
    finally:
        web.send_signal(signal.SIGTERM)
        try:
            web.wait(timeout=15)
        except subprocess.TimeoutExpired:
            web.kill()
            web.wait()
        log.close()


@contextlib.contextmanager
def run_process(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Runs a child in the repo with stdout and stderr in `log`; SIGTERM (then kill) at the end."""
    with log.open("wb") as out:
        child = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                 env={k: v for k, v in {**os.environ, **env}.items() if v is not None})
        try:
            yield child
        finally:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def log_lines(log: Path) -> list[dict[str, Any]]:
    """The structured (JSON, with an `event`) lines of a process's log; other lines skipped."""
    lines = []
    for raw in log.read_text().splitlines():
        with contextlib.suppress(ValueError):
            parsed = json.loads(raw)
            if isinstance(parsed, dict) and "event" in parsed:
                lines.append(parsed)
    return lines
