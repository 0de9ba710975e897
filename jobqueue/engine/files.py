"""Files of the Batch API, stored in Postgres in pieces: streamed in, streamed out, never whole.

Why Postgres: a file is one more row family in the database every job already lives in, so it
is backed up, replicated, scoped to its org and removed by retention like everything else, and
a batch reads its lines in the same transactions that write its requests. A 200 MB file is 200
pieces of a MiB; neither the upload nor the download holds more than a piece or two in memory.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.errors import InvalidInput, NotFound
from jobqueue.core.queries import file as q
from jobqueue.core.tokens import Caller

__all__ = ["FILE_CHUNK_BYTES", "FileLimits", "FileTooLarge", "UploadTimedOut", "delete_file",
           "get_file", "list_files", "read_chunks", "store_file"]

log = structlog.get_logger(__name__)

FILE_CHUNK_BYTES = 1024 * 1024
"""The length of every piece of an upload but its last (0025_openai_batches.sql relies on it)."""

_DOWNLOAD_PAGE = 4
"""Pieces read per round trip of a download."""

Row = dict[str, Any]
Reader = Callable[[int], bytes]


class FileTooLarge(InvalidInput):
    """An upload passed a size or line limit (its own, or its org's storage)."""

    title = "File too large"


class UploadTimedOut(InvalidInput):
    """The client did not send the whole file within SA_FILE_UPLOAD_TIMEOUT."""

    title = "Upload timed out"


@dataclass(frozen=True)
class FileLimits:
    """What one upload may hold: bytes, non-blank lines, the org's storage, and its time."""

    max_bytes: int
    max_lines: int
    org_max_bytes: int
    timeout: float


class _LineCounter:
    """Counts non-blank lines across pieces (a line may straddle two)."""

    def __init__(self) -> None:
        self.lines = 0
        self._open = False  # NOTE: the last piece ended inside a non-blank line

    def feed(self, data: bytes) -> int:
        """Returns how many non-blank lines `data` ends (and counts them)."""
        parts = data.split(b"\n")
        ended = 0
        for part in parts[:-1]:
            if self._open or part.strip():
                ended += 1
            self._open = False
        self._open = self._open or bool(parts[-1].strip())
        self.lines += ended
        return ended

    def finish(self) -> int:
        """Counts a last line without a newline."""
        ended = int(self._open)
        self._open = False
        self.lines += ended
        return ended


def store_file(pool: ConnectionPool[DictConnection], caller: Caller, read: Reader, *,
               filename: str, purpose: str, ttl: float | None, limits: FileLimits,
               check_end: Callable[[], None]) -> Row:
    """Streams an upload into pieces of FILE_CHUNK_BYTES; the file appears once it is whole.

    Args:
        pool: database pool (one connection borrowed per piece, never across client reads).
        caller: the org and user the file belongs to.
        read: reads up to n bytes of the upload (b"" at its end).
        filename: the client's name for it (checked by the caller).
        purpose: `batch`.
        ttl: seconds until the file expires (None: never).
        limits: the bounds of one upload.
        check_end: raises unless the upload ended as it should (a cut body reads as a short
            file; its framing tells), before the file is made visible.

    Returns:
        The file's row.

    Raises:
        FileTooLarge: past `max_bytes` or `max_lines`, or past the org's storage; nothing is kept.
        UploadTimedOut: the upload took longer than `limits.timeout`; nothing is kept.
    """
    file_id = uuid.uuid4()
    scope = {"org_id": caller.org_id}
    with pool.connection() as conn:
        used = conn.execute(q.FILE_ORG_BYTES, scope).fetchone()
        assert used is not None
        room = limits.org_max_bytes - int(used["bytes"])
        if room <= 0:
            raise FileTooLarge(f"your organization already stores {used['bytes']} bytes of files "
                               f"(at most {limits.org_max_bytes}); delete some first")
        conn.execute(q.FILE_INSERT, {**scope, "id": file_id, "user_id": caller.user_id,
                                     "purpose": purpose, "filename": filename})
    try:
        _stream_pieces(pool, file_id, read, limits, min(room, limits.max_bytes))
        check_end()
        with pool.connection() as conn:
            row = conn.execute(q.FILE_COMPLETE, {**scope, "id": file_id, "ttl": ttl}).fetchone()
    except BaseException:
        # NOTE: an upload refused, cut or timed out leaves nothing behind (pieces cascade).
        with pool.connection() as conn:
            conn.execute(q.FILE_DELETE_INCOMPLETE, {**scope, "id": file_id})
        raise
    assert row is not None
    log.info("file.stored", file_id=str(file_id), org_id=caller.org_id, bytes=row["bytes"],
             lines=row["lines"])
    return row


def _stream_pieces(pool: ConnectionPool[DictConnection], file_id: uuid.UUID, read: Reader,
                   limits: FileLimits, max_bytes: int) -> None:
    counter = _LineCounter()
    deadline = time.monotonic() + limits.timeout
    size, seq, buffer, lines = 0, 0, bytearray(), 0
    while True:
        data = read(FILE_CHUNK_BYTES - len(buffer))
        if time.monotonic() > deadline:
            raise UploadTimedOut(f"the file did not arrive within {limits.timeout:g} s")
        size += len(data)
        if size > max_bytes:
            own = max_bytes == limits.max_bytes
            raise FileTooLarge(f"a file may hold at most {limits.max_bytes} bytes" if own else
                               f"this file would take your organization past its "
                               f"{limits.org_max_bytes} bytes of files")
        buffer += data
        lines += counter.feed(data) + (0 if data else counter.finish())
        if counter.lines > limits.max_lines:
            raise FileTooLarge(f"a file may hold at most {limits.max_lines} requests (lines)")
        if buffer and (len(buffer) == FILE_CHUNK_BYTES or not data):
            with pool.connection() as conn:
                conn.execute(q.FILE_CHUNK_INSERT, {"file_id": file_id, "seq": seq,
                                                   "data": bytes(buffer), "lines": lines})
            seq, buffer, lines = seq + 1, bytearray(), 0
        elif lines and not data:
            with pool.connection() as conn:
                conn.execute(q.FILE_COUNT_LINES, {"file_id": file_id, "lines": lines})
        if not data:
            if size == 0:
                raise InvalidInput("the file is empty")
            return


def get_file(pool: ConnectionPool[DictConnection], caller: Caller, file_id: uuid.UUID) -> Row:
    """Returns the org's file.

    Raises:
        NotFound: no complete file of that id in the caller's org.
    """
    with pool.connection() as conn:
        row = conn.execute(q.FILE_GET, {"id": file_id, "org_id": caller.org_id}).fetchone()
    if row is None:
        raise NotFound(f"No such File object: {file_id}")
    return row


def list_files(pool: ConnectionPool[DictConnection], caller: Caller, *, purpose: str | None,
               after: uuid.UUID | None, limit: int, descending: bool) -> tuple[list[Row], bool]:
    """Returns a page of the org's files after the file `after`, and whether more follow.

    Raises:
        NotFound: `after` names no file of the org.
    """
    after_created: datetime | None = None
    if after is not None:
        after_created = get_file(pool, caller, after)["created_at"]
    statement = q.FILE_LIST_PAGE_DESC if descending else q.FILE_LIST_PAGE_ASC
    with pool.connection() as conn:
        rows = conn.execute(statement, {"org_id": caller.org_id, "purpose": purpose,
                                        "after_created": after_created, "after_id": after,
                                        "limit": limit + 1}).fetchall()
    return rows[:limit], len(rows) > limit


def delete_file(pool: ConnectionPool[DictConnection], caller: Caller, file_id: uuid.UUID) -> None:
    """Deletes the org's file and its pieces.

    Raises:
        NotFound: no complete file of that id in the caller's org.
    """
    with pool.connection() as conn:
        row = conn.execute(q.FILE_DELETE, {"id": file_id, "org_id": caller.org_id}).fetchone()
    if row is None:
        raise NotFound(f"No such File object: {file_id}")
    log.info("file.deleted", file_id=str(file_id), org_id=caller.org_id)


def read_chunks(pool: ConnectionPool[DictConnection], file_id: uuid.UUID,
                first_seq: int = 0) -> Iterator[bytes]:
    """Yields a file's pieces in order, a few per round trip, holding no connection between.

    NOTE: the caller has checked the file is the org's; a file deleted meanwhile ends early.
    """
    seq = first_seq
    while True:
        with pool.connection() as conn:
            rows = conn.execute(q.FILE_CHUNK_LIST_PAGE, {"file_id": file_id, "seq": seq,
                                                         "limit": _DOWNLOAD_PAGE}).fetchall()
        for row in rows:
            yield bytes(row["data"])
        if len(rows) < _DOWNLOAD_PAGE:
            return
        seq = rows[-1]["seq"] + 1
