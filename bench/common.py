"""Shared bench plumbing: a throwaway database, child processes, percentiles."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from jobqueue.core.db import open_pool
from jobqueue.core.tokens import create_token
from jobqueue.devtools import embedded_db

__all__ = [
    "BACKLOG",
    "REPO",
    "VENV_BIN",
    "bench_token",
    "format_table",
    "percentile",
    "scratch_database",
    "spawn",
    "start_slow_provider",
    "wait_http",
    "web_server",
]

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

# NOTE: N queued prompts of org 1 in one statement (%s is N), for the burn-down benches.
BACKLOG = """
WITH p AS (
    INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, content)
    SELECT g, 'prompt', 1, 1, g, 'bench prompt ' || n
      FROM (SELECT gen_random_uuid() AS g, n FROM generate_series(1, %s) n) s
    RETURNING id
)
INSERT INTO sa_job (id, prompt_id, org_id, created_by) SELECT gen_random_uuid(), id, 1, 1 FROM p
"""


def scratch_database(*, migrated: bool = True) -> contextlib.AbstractContextManager[str]:
    """A throwaway database on SA_BENCH_DATABASE_URL's server (else local, else embedded)."""
    return embedded_db.scratch_database("sa_bench", "SA_BENCH_DATABASE_URL", migrated=migrated)


def spawn(args: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Starts a child in the repo with output discarded."""
    return subprocess.Popen(list(args), cwd=REPO, env={**os.environ, **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_slow_provider(latency: float, stream: int = 0,
                        chunk_chars: int = 0) -> tuple[subprocess.Popen[str], str]:
    """Starts bench/slow_provider.py (streaming `stream` chunks per answer asked for as a
    stream, each padded with `chunk_chars` characters); returns it and its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "bench.slow_provider", "--latency", str(latency),
                             "--stream", str(stream), "--chunk-chars", str(chunk_chars)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"the slow provider did not start: {line!r}")
    return proc, f"http://127.0.0.1:{line.split()[-1]}/v1"


def wait_http(url: str, timeout: float = 30.0) -> None:
    """Waits until `url` answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise SystemExit(f"{url} did not answer within {timeout}s")


def percentile(values: Sequence[float], q: float) -> float:
    """Returns the q-th percentile (0..100) by the inclusive method."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if q < 100 else max(values)


def bench_token(database_url: str) -> str:
    """Creates a token for org 1, user 1 in the bench database."""
    pool = open_pool(database_url, name="bench-token", max_size=1)
    try:
        return create_token(pool, 1, 1)
    finally:
        pool.close()


@contextlib.contextmanager
def web_server(env: dict[str, str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    """Runs the web exactly as the Procfile's `web:` line, on `port`, until the block ends.

    `env` carries DATABASE_URL (and any other setting); yields the gunicorn master process.
    """
    web = spawn([str(VENV_BIN / "gunicorn"), "-c", "python:service.gunicorn_conf",
                 "service.app:create_app()"],
                {**env, "PORT": str(port)})
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz")
        yield web
    finally:
        web.terminate()
        web.wait(timeout=60)


def format_table(lines: Sequence[Sequence[str]], left: int = 0) -> str:
    """Aligns rows (the first is the header) under a rule; the first `left` columns left-aligned."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = ["  ".join(cell.ljust(w) if i < left else cell.rjust(w)
                     for i, (cell, w) in enumerate(zip(line, widths, strict=True)))
           for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)
