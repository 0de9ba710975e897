"""Tells a refused connection that retrying will not fix (bad credentials, a missing database, a
refused startup parameter) from one that may pass (a server down, restarting or full)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping

import psycopg

from jobqueue.core.redact import redact

__all__ = ["CONNECT_TIMEOUT", "DatabaseRefused", "check_connection", "check_urls",
           "permanent_reason", "refusal"]

CONNECT_TIMEOUT = 2
"""Seconds a check waits for the server (libpq's smallest connect_timeout)."""

# NOTE: libpq hands a refused connection over as text only (no SQLSTATE before a session exists),
# so the server's and PgBouncer's own sentences are matched; a server whose lc_messages is not
# English answers in its language and is treated as a failure that may pass (the pool retries).
_PERMANENT: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"unsupported startup parameter|unrecognized configuration parameter"
                r"|invalid value for parameter"),
     "a startup parameter is refused; behind a pooler such as PgBouncer declare it with "
     "SA_DATABASE_POOLER=transaction (or session), so that none is sent"),
    (re.compile(r'database "[^"]*" does not exist|no such database'),
     "the database does not exist: create it (createdb NAME) or fix the URL's dbname"),
    (re.compile(r'role "[^"]*" does not exist|no such user|password authentication failed'
                r"|SASL authentication failed|no password supplied|authentication failed"),
     "the user or password is refused: fix the URL's credentials"),
    (re.compile(r"no pg_hba\.conf entry|is not permitted to log in|permission denied for database"),
     "the server does not let this user connect (pg_hba.conf, LOGIN or CONNECT privilege)"),
    (re.compile(r"server does not support SSL"), "the URL requires SSL, which the server does not offer"),
)


class DatabaseRefused(Exception):
    """The database (or a pooler in front of it) refuses the connection for a reason that
    retrying will not fix; the message is one line, without the password."""


def permanent_reason(message: str) -> str | None:
    """Returns what to do about a refusal that will not go away, or None when it may pass."""
    return next((what for pattern, what in _PERMANENT if pattern.search(message)), None)


def _server_words(message: str) -> str:
    """The FATAL sentence of libpq's message (or its last line), without libpq's preamble."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    fatal = next((line[line.index("FATAL:"):] for line in lines if "FATAL:" in line), None)
    return " ".join((fatal or (lines[-1] if lines else message)).split())


def refusal(name: str, exc: psycopg.OperationalError) -> DatabaseRefused | None:
    """The one-line error for `exc` when retrying will not fix it, else None.

    Args:
        name: what the connection is for, as the message names it (`DATABASE_URL`, ...).
        exc: what connecting raised.
    """
    what = permanent_reason(str(exc))
    if what is None:
        return None
    return DatabaseRefused(redact(f"{name}: the database refuses the connection "
                                  f"({_server_words(str(exc))}): {what}"))


def check_connection(conninfo: str, *, name: str, timeout: int = CONNECT_TIMEOUT) -> None:
    """Opens and closes one connection to `conninfo`.

    Args:
        conninfo: libpq URI (its password never reaches a message).
        name: what the connection is for, as the message names it (`DATABASE_URL`, ...).
        timeout: seconds to wait for the server.

    Raises:
        DatabaseRefused: the refusal will not go away (retrying is pointless), or `conninfo` is
            malformed (the message never repeats it).
        psycopg.OperationalError: the server cannot be reached now (down, restarting, full).
    """
    try:
        psycopg.connect(conninfo, connect_timeout=max(CONNECT_TIMEOUT, timeout)).close()
    except psycopg.ProgrammingError:
        # NOTE: libpq's parse error quotes the whole string, password included.
        raise DatabaseRefused(f"{name} is malformed: neither a postgresql:// URI nor key=value "
                              "pairs (value not shown: it may hold a password)") from None
    except psycopg.OperationalError as exc:
        refused = refusal(name, exc)
        if refused is None:
            raise
        raise refused from None


def check_urls(urls: Mapping[str, str]) -> None:
    """Checks each distinct URL of `urls` (setting name -> conninfo) with `check_connection`.

    Raises:
        DatabaseRefused: one is refused for good (a server that is down is left to the pools).
    """
    checked: set[str] = set()
    for name, url in urls.items():
        if url not in checked:
            checked.add(url)
            with contextlib.suppress(psycopg.OperationalError):
                check_connection(url, name=name)
