"""One bad row never stops the others: a batch write that fails is split in halves and written again,
down to the rows that cannot be written, which the caller sets aside.

Every statement that writes a page or a batch of jobs (finalize, reject, heartbeat, release,
reclaim, archive, settling a chain, an operator's bulk action) goes through `write_isolated`.
Before it, one row that no
statement could write (a chain whose settling overflowed the stack, a broken constraint, an
operator's trigger) failed its whole batch, every time: a reclaim page that held it failed in
every round, for every org.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from jobqueue.core.db import DictConnection

__all__ = ["Isolated", "is_connection_failure", "write_isolated"]

T = TypeVar("T")
R = TypeVar("R")

# NOTE: failures that say nothing about the rows: the connection or the server went away, or the
# statement ran out of time or waited too long for a lock. Splitting the batch would only repeat
# them, once per half (a timeout of 30 s, 2 x log2(256) times over), so they are raised.
_NOT_A_ROW = ("57P01", "57P02", "57P03", "57014", "55P03")


@dataclass
class Isolated(Generic[T, R]):
    """What a split write wrote (`rows`, every statement's answers together) and what it could not."""

    rows: list[R] = field(default_factory=list)
    failed: list[tuple[T, psycopg.Error]] = field(default_factory=list)

    def extend(self, other: Isolated[T, R]) -> None:
        self.rows.extend(other.rows)
        self.failed.extend(other.failed)


def is_connection_failure(conn: DictConnection, exc: psycopg.Error) -> bool:
    """True when `exc` is the connection's or the server's trouble, not the rows'."""
    sqlstate = exc.sqlstate or ""
    return conn.broken or conn.closed or sqlstate.startswith("08") or sqlstate in _NOT_A_ROW


def write_isolated(
    conn: DictConnection,
    items: Sequence[T],
    write: Callable[[DictConnection, Sequence[T]], list[R]],
) -> Isolated[T, R]:
    """Writes `items` with `write`; on a failure of the rows, writes each half again, recursively.

    Inside a transaction each try is a savepoint, so a failed half leaves the rest of the
    transaction usable; in autocommit each try is its own statement. A batch with one bad row
    costs about 2 x log2(len(items)) more statements, and only when it fails.

    Args:
        conn: the connection to write on (autocommit, or in the caller's transaction).
        items: the batch, in the order `write` takes it.
        write: runs one statement for the items given and returns its rows.

    Returns:
        Every row written, and each item that failed alone with its error.

    Raises:
        psycopg.Error: a failure of the connection or the server (`is_connection_failure`).
    """
    result: Isolated[T, R] = Isolated()
    if not items:
        return result
    try:
        if conn.info.transaction_status == TransactionStatus.IDLE:
            result.rows.extend(write(conn, items))
        else:
            with conn.transaction():
                result.rows.extend(write(conn, items))
        return result
    except psycopg.Error as exc:
        if is_connection_failure(conn, exc):
            raise
        if len(items) == 1:
            result.failed.append((items[0], exc))
            return result
    middle = len(items) // 2
    result.extend(write_isolated(conn, items[:middle], write))
    result.extend(write_isolated(conn, items[middle:], write))
    return result
