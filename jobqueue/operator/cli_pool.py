"""Runs one CLI action on a one-connection pool: its answer on stdout (text or `--json`), or a one-line
error on stderr and exit 1."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.dbcheck import CONNECT_TIMEOUT, check_connection
from jobqueue.core.errors import JobQueueError
from jobqueue.core.jsonable import json_default
from jobqueue.core.settings import Settings

__all__ = ["CONNECT_TIMEOUT", "Answer", "fail", "one_line", "print_answer", "probe", "with_cli_pool"]

@dataclass(frozen=True, slots=True)
class Answer:
    """What a command prints: `text` for people, `data` (JSON-able) for `--json`."""

    text: str
    data: Any


def print_answer(answer: Answer, as_json: bool) -> None:
    """Prints `answer` on stdout; with `as_json`, JSON: indented for a terminal, else one line (so a
    log collector reading a release step's output sees one JSON object per line)."""
    if as_json:
        print(json.dumps(answer.data, default=json_default, indent=2 if sys.stdout.isatty() else None))
    else:
        print(answer.text)


def one_line(message: str) -> str:
    """Joins a multi-line message (libpq's, for one) into one line."""
    return "; ".join(part.strip() for part in message.splitlines() if part.strip())


def fail(message: str) -> int:
    """Prints `sa-core: message` on stderr as one line; returns exit code 1."""
    print(f"sa-core: {one_line(message)}", file=sys.stderr)
    return 1


def probe(conninfo: str) -> None:
    """Opens and closes one connection within CONNECT_TIMEOUT.

    NOTE: before a pool is opened, so an unreachable database is one clear error (libpq's
    reason) in about CONNECT_TIMEOUT, instead of a pool retrying and logging until its timeout.

    Raises:
        jobqueue.core.dbcheck.DatabaseRefused: refused for good (credentials, no such database).
        psycopg.OperationalError: the database cannot be reached.
    """
    check_connection(conninfo, name="DATABASE_URL")


def with_cli_pool(action: Callable[[ConnectionPool[DictConnection]], Answer], as_json: bool = False) -> int:
    """Prints what `action` returns and exits 0; a domain error exits 1 with a one-line message.

    Raises:
        psycopg.OperationalError, psycopg_pool.PoolTimeout: the database cannot be reached
            (`sa-core` prints one line and exits 1).
    """
    settings = Settings.from_env()
    probe(settings.database_url)
    pool = open_pool(settings.database_url, name="cli", max_size=1, timeout=CONNECT_TIMEOUT,
                     prepare=settings.prepared_statements)
    try:
        print_answer(action(pool), as_json)
    except JobQueueError as exc:
        return fail(exc.description)
    finally:
        pool.close()
    return 0
