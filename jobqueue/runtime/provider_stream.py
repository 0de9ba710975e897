"""A streamed answer's body as lines: chunked transfer undone here, one read per arrival.

PERF: a streamed answer comes as many small chunks (one per token or word), and http.client's
readline on a chunked body costs several Python calls per line (peek, chunk bookkeeping, read)
plus a blocking look for the next chunk's size line. Reading the response's buffer with `read1`
takes whatever arrived in one call, and the framing is undone with bytes operations. Its end is
found too: when the terminating chunk came with the last event, the response is complete and
its connection serves the next call (http.client left it unread, so the connection was dropped
after every streamed answer).
"""

from __future__ import annotations

import http.client
from collections import deque
from collections.abc import Generator, Iterator

from jobqueue.runtime.provider_answer import TooLarge

__all__ = ["ChunkedLines"]

_READ = 65536
# NOTE: a chunk-size line is a hex number with optional extensions: far below this.
_MAX_SIZE_LINE = 4096


class ChunkedLines:
    """The lines of a chunked response body (without their line ends), read as they arrive.

    Iterating ends at the terminating chunk, or when the connection ends first (a cut stream:
    the caller sees no end-of-answer marker). `finish` after the caller's last line marks the
    response complete when the rest of the body is already here.

    Raises (while iterating):
        TooLarge: the body passed `limit` bytes.
        http.client.IncompleteRead: the chunked framing is broken.
    """

    def __init__(self, response: http.client.HTTPResponse, limit: int) -> None:
        assert response.fp is not None
        self._response = response
        self._fp = response.fp
        self._limit = limit
        self._seen = 0
        self._raw = b""
        self._partial = b""
        self._lines: deque[bytes] = deque()
        self._ended = False
        self._running: Generator[bytes, None, None] | None = None

    def __iter__(self) -> Iterator[bytes]:
        self._running = self._run()
        return self._running

    def _run(self) -> Generator[bytes, None, None]:
        # PERF: one loop with local names: it runs once per arrival of every streamed answer.
        raw, partial, lines = self._raw, self._partial, self._lines
        read, limit, seen = self._fp.read1, self._limit, self._seen
        try:
            while True:
                while lines:
                    yield lines.popleft()
                head = raw.find(b"\r\n")
                if head >= 0:
                    size = _chunk_size(raw[:head])
                    end = head + 2 + size
                    if size == 0:
                        # NOTE: the last chunk; the trailer section ends with an empty line.
                        if raw.find(b"\r\n\r\n", head) >= 0:
                            self._ended = True
                            break
                    elif len(raw) >= end + 2:
                        *more, partial = (partial + raw[head + 2:end]).split(b"\n")
                        lines.extend(more)
                        raw = raw[end + 2:]
                        continue
                elif len(raw) > _MAX_SIZE_LINE:
                    raise http.client.IncompleteRead(raw[:64])
                data = read(_READ)
                if not data:
                    break
                seen += len(data)
                if seen > limit:
                    raise TooLarge(self._response.status)
                raw += data
            if partial:
                yield partial
                partial = b""
        finally:
            self._raw, self._partial, self._seen = raw, partial, seen

    def finish(self) -> None:
        """Marks the response complete (its connection reusable) when only blank lines and the
        terminating chunk are left of it and have already arrived; else leaves it (the caller
        then drops the connection)."""
        if self._running is not None:
            # NOTE: its state is saved as it closes.
            self._running.close()
        raw = self._raw
        while not self._ended:
            head = raw.find(b"\r\n")
            if head < 0:
                return
            size = _chunk_size(raw[:head])
            if size == 0:
                self._ended = raw.find(b"\r\n\r\n", head) >= 0
                if not self._ended:
                    return
            elif len(raw) >= head + 4 + size:
                self._lines.extend((self._partial + raw[head + 2:head + 2 + size]).split(b"\n"))
                self._partial, raw = b"", raw[head + 4 + size:]
            else:
                return
        if not self._partial.strip() and not any(line.strip() for line in self._lines):
            self._response.close()


def _chunk_size(line: bytes) -> int:
    try:
        return int(line.split(b";", 1)[0], 16)
    except ValueError:
        raise http.client.IncompleteRead(line[:64]) from None
