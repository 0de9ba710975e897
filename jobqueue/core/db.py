"""Connection pools with an explicit lifecycle: created closed, opened with a deadline, closed on shutdown."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import psycopg
import structlog
from psycopg import Connection
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

from jobqueue.core.dbcheck import check_connection
from jobqueue.core.green_wait import ReadyFirstConnection
from jobqueue.core.queries.maintenance import MAINTENANCE_SET_STATEMENT_TIMEOUT

__all__ = ["SESSION_SETTINGS", "DictConnection", "borrow", "open_pool", "reconnecting", "terminated"]

DictConnection = Connection[DictRow]

log = structlog.get_logger(__name__)

T = TypeVar("T")

# NOTE: the server ended the session (pg_terminate_backend, a shutdown, a crash restart): the
# statement it answered with this was not committed.
_TERMINATED = frozenset({"57P01", "57P02", "57P03"})

_PREPARE_AFTER = 5
"""psycopg's own default: executions of one statement on a connection before it is prepared."""

# PERF: every statement the service runs is written to be served by an index (tests/test_plans.py
# checks the hot path). A plan made while a table was young, a fresh deployment's first rows,
# reads it sequentially, and a session keeps that plan, for its prepared statements and for its
# triggers' statements alike, until the table is next analyzed: under steady arrivals every
# finalize batch and every finished job's trigger then read the whole of sa_job, and the worker
# fell behind for good (bench/sustained.py). The service's sessions price sequential scans out,
# so a young table is read through the index a grown one needs; a statement with no index to
# use still runs. SET for the session (set_config(..., false)).
SESSION_SETTINGS = "SELECT set_config('enable_seqscan', 'off', false)"


def open_pool(
    conninfo: str,
    *,
    name: str,
    min_size: int = 1,
    max_size: int = 10,
    timeout: float = 10.0,
    checkout_timeout: float = 30.0,
    prepare: bool = True,
) -> ConnectionPool[DictConnection]:
    """Opens a pool whose connections return rows as dicts.

    Args:
        conninfo: libpq URI.
        name: pool name, shown in logs and `get_stats()`.
        min_size: connections kept open.
        max_size: connections at most.
        timeout: seconds to wait for the first connection; startup fails fast past it.
        checkout_timeout: seconds a caller waits for a connection before PoolTimeout; web
            requests use a short one so an outage answers 503 quickly instead of hanging.
        prepare: let psycopg prepare a statement server-side once it ran 5 times on a
            connection (`SA_PREPARED_STATEMENTS`); False behind a transaction-mode pooler,
            which hands the next transaction another server session where the statement
            does not exist.

    Every connection handed out passed `_check_idle` first, so one the server closed while it
    sat idle (a backend killed, a restart, a cut network) is replaced before anything is sent
    on it: the caller never sees that failure.

    Returns:
        An open pool; the caller closes it.

    Raises:
        psycopg.ProgrammingError: `conninfo` is malformed (the message never repeats it).
        jobqueue.core.dbcheck.DatabaseRefused: the database refuses the connection for a reason
            retrying will not fix (credentials, a missing database, a refused startup parameter).
        psycopg_pool.PoolTimeout: the database did not answer within `timeout`.
    """
    try:
        conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        # NOTE: libpq's parse error quotes the whole string, password included; the pool would
        # log it on every connection attempt and a start-up traceback would print it.
        raise psycopg.ProgrammingError(
            f"the connection string of pool {name!r} is malformed: neither a postgresql:// URI "
            "nor key=value pairs (value not shown: it may hold a password)") from None

    def check(conn: DictConnection) -> None:
        try:
            _check_idle(conn)
        except psycopg.OperationalError:
            # NOTE: a dead connection rarely dies alone (a restart or a mass kill ends them
            # all): the others are tested now, in one sweep, instead of one per checkout with
            # the pool's growing pause between failed checks.
            log.info("db.idle_connection_lost", pool=name)
            pool.check()
            raise

    def configure(conn: DictConnection) -> None:
        conn.execute(SESSION_SETTINGS)

    pool: ConnectionPool[DictConnection] = ConnectionPool(
        conninfo,
        name=name,
        # NOTE: not behind a transaction-mode pooler, where a session setting would stay on
        # whichever server session ran it; there nothing is prepared either, so every statement
        # is planned for the size its tables have at that moment.
        configure=configure if prepare else None,
        min_size=min_size,
        max_size=max_size,
        # PERF: preparing saves the server's parse and plan: about 0.3 ms of a 1.7 ms POST
        # /prompt; a worker's batched claims and finalizes barely notice (bench/throughput.py).
        kwargs={"row_factory": dict_row, "autocommit": True,
                "prepare_threshold": _PREPARE_AFTER if prepare else None},
        connection_class=ReadyFirstConnection,
        timeout=checkout_timeout,
        # NOTE: keep retrying through a long outage; the default gives up after 5 minutes.
        reconnect_timeout=3600.0,
        check=check,
        open=False,
    )
    # NOTE: one connection first, so that a refusal retrying cannot fix is one line at once
    # instead of the pool's warnings until `timeout` (or, later, for an hour); a server that is
    # down or starting is left to the pool's retries.
    with contextlib.suppress(psycopg.OperationalError):
        check_connection(conninfo, name=f"{name} pool")
    pool.open(wait=True, timeout=timeout)
    return pool


def _check_idle(conn: DictConnection) -> None:
    """Raises OperationalError, closing `conn`, when the server has hung up on it; no round trip.

    An idle connection has nothing to read unless the server closed it, often after sending a
    FATAL message (`pg_terminate_backend`, shutdown). libpq's socket is non-blocking, so reading
    costs a system call and never waits (nor yields, under gevent). The first read takes in such
    a message, the second meets the end of the stream.

    PERF: about 2 us per checkout, against about 100 us for the pool's `check_connection` (an
    empty query's round trip).
    """
    try:
        conn.pgconn.consume_input()
        conn.pgconn.consume_input()
    except psycopg.OperationalError:
        conn.close()
        raise


@contextmanager
def borrow(db: ConnectionPool[DictConnection] | DictConnection) -> Iterator[DictConnection]:
    """Yields a connection: one taken from `db` for the block when it is a pool, else `db` itself.

    Maintenance loops take either, so the leader can run them on its own session connection.
    """
    if isinstance(db, ConnectionPool):
        with db.connection() as conn:
            yield conn
    else:
        yield db


def delete_in_pages(db: ConnectionPool[DictConnection] | DictConnection, statement: str,
                    params: dict[str, float], *, page: int, statement_timeout: float) -> int:
    """Runs a delete of at most `page` rows (its `limit`) until a short page; returns the rows.

    Each page is its own short transaction under `statement_timeout`, so a large backlog never
    holds locks or a snapshot for long.
    """
    timeout = {"timeout_ms": str(max(1, round(statement_timeout * 1000)))}
    deleted = 0
    with borrow(db) as conn:
        while True:
            with conn.transaction():
                conn.execute(MAINTENANCE_SET_STATEMENT_TIMEOUT, timeout)
                cur = conn.execute(statement, {**params, "limit": page})
            deleted += cur.rowcount
            if cur.rowcount < page:
                return deleted


def terminated(conn: DictConnection, exc: psycopg.OperationalError) -> bool:
    """True when `exc` says the server ended `conn` (or the connection was lost) before answering."""
    return exc.sqlstate in _TERMINATED or (exc.sqlstate is None and conn.broken)


def reconnecting(pool: ConnectionPool[DictConnection], work: Callable[[DictConnection], T]) -> T:
    """Runs `work` on a pooled connection, and once more on a fresh one when the server ended the
    first before it answered.

    The checkout check (`_check_idle`) only sees a connection the server has already closed; one
    it is terminating at that moment (a backend killed, a failover under way) passes, and its
    first statement fails. Such a kill rarely ends one connection alone, and the next checkout
    could hand out another that is still going: before the second try every idle connection is
    tested by a round trip (`pool.check()`), which waits out a backend that is still exiting.
    So a kill that is over is never shown to a client as a 503.

    Only for work that is safe to run twice: reads, and writes that recognize their own first try
    (enqueue writes ids chosen beforehand, so a second try finds them taken).

    Raises:
        psycopg.Error: what the second try (or a first failure of another kind) raised.
    """
    with pool.connection() as conn:
        try:
            return work(conn)
        except psycopg.OperationalError as exc:
            if not terminated(conn, exc):
                raise
            log.info("db.connection_terminated", pool=pool.name, sqlstate=exc.sqlstate)
    pool.check()
    with pool.connection() as conn:
        return work(conn)
