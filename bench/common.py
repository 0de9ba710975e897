"""Shared bench plumbing: a throwaway database, child processes, percentiles."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from jobqueue.embedded_db import start_embedded
from jobqueue.migrate import migrate
from jobqueue.queries import admin

__all__ = ["REPO", "VENV_BIN", "percentile", "scratch_database", "spawn", "wait_http"]

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"


def _admin() -> str:
    explicit = os.environ.get("SA_BENCH_DATABASE_URL")
    if explicit:
        return explicit
    try:
        psycopg.connect(LOCAL_POSTGRES, connect_timeout=2).close()
    except psycopg.OperationalError:
        return start_embedded()
    return LOCAL_POSTGRES


@contextlib.contextmanager
def scratch_database() -> Iterator[str]:
    """Creates and migrates a throwaway database, dropped afterwards."""
    admin_url = _admin()
    name = f"sa_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(admin.DATABASE_CREATE.format(sql.Identifier(name)))
    url = make_conninfo(admin_url, dbname=name)
    try:
        migrate(url)
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(admin.DATABASE_DROP.format(sql.Identifier(name)))


def spawn(args: Sequence[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Starts a child in the repo with output discarded."""
    return subprocess.Popen(list(args), cwd=REPO, env={**os.environ, **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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
