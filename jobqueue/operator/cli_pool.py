"""Runs one CLI action on a one-connection pool: its text on stdout, or its error on stderr and exit 1."""

from __future__ import annotations

import sys
from collections.abc import Callable

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.errors import JobQueueError
from jobqueue.core.settings import Settings

__all__ = ["with_cli_pool"]


def with_cli_pool(action: Callable[[ConnectionPool[DictConnection]], str]) -> int:
    """Prints what `action` returns and exits 0; a domain error or an unreachable database exits 1
    with a one-line message, never a traceback."""
    try:
        settings = Settings.from_env()
        pool = open_pool(settings.database_url, name="cli", max_size=1,
                         prepare=settings.prepared_statements)
    except (PoolTimeout, psycopg.OperationalError) as exc:
        return _fail(f"database unreachable: {type(exc).__name__}: {exc}")
    try:
        print(action(pool))
    except JobQueueError as exc:
        return _fail(exc.description)
    except (PoolTimeout, psycopg.OperationalError) as exc:
        return _fail(f"database unreachable: {type(exc).__name__}: {exc}")
    finally:
        pool.close()
    return 0


def _fail(message: str) -> int:
    print(f"sa-core: {message}", file=sys.stderr)
    return 1
