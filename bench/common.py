"""Shared bench plumbing: a throwaway database, child processes, percentiles."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from jobqueue import embedded_db

__all__ = ["REPO", "VENV_BIN", "percentile", "scratch_database", "spawn", "wait_http"]

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def scratch_database(*, migrated: bool = True) -> contextlib.AbstractContextManager[str]:
    """A throwaway database on SA_BENCH_DATABASE_URL's server (else local, else embedded)."""
    return embedded_db.scratch_database("sa_bench", "SA_BENCH_DATABASE_URL", migrated=migrated)


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
