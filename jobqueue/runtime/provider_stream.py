"""Streamed answers read cheaply: chunked transfer undone here, and one loop reading them all.

PERF: a streamed answer comes as many small chunks (a word or a few tokens each), so what a chunk
costs to read is paid twenty or a thousand times per call. Two costs are cut:
- http.client's readline on a chunked body costs several Python calls per line (peek, chunk
  bookkeeping, read); `ChunkedBody` takes whatever arrived in one read and undoes the framing
  with bytes operations. It also finds the body's end, so when the terminating chunk came with
  the last event the connection serves the next call (http.client left it unread, and the
  connection was dropped after every streamed answer).
- a job thread blocked on its socket is woken once per chunk; under gevent a wake-up (the
  watcher, the timeout, two greenlet switches) cost more than everything else the chunk needs.
  `StreamPoller` reads every streamed body of the process in one loop instead: each
  `tick` it asks epoll, without blocking, which sockets have something, reads those, and hands
  their lines to their calls' handlers; the job thread sleeps until its body ends. A chunk
  then waits at most `tick` (10 ms), well within the SA_STREAM_INTERVAL its text waits anyway.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import structlog

from jobqueue.runtime.provider_answer import TooLarge, check_storable, unreadable
from jobqueue.runtime.provider_transport import DeadlineReader

__all__ = ["ChunkedBody", "StreamPoller", "StreamedAnswer", "poller"]

_READ = 65536
# NOTE: a chunk-size line is a hex number with optional extensions: far below this.
_MAX_SIZE_LINE = 4096
# NOTE: how long past a call's deadline its thread waits for the loop before giving up on it.
_LOOP_SLACK = 5.0

log = structlog.get_logger(__name__)


class ChunkedBody:
    """A chunked response body, undone into lines (without their line ends) as data comes.

    `push` takes what arrived; `lines` holds the whole lines found; `ended` is set at the
    terminating chunk. Iterating reads the response itself (blocking) and yields the lines up
    to the end, or until the connection ends first (a cut stream: the caller sees no
    end-of-answer marker). `finish` after the caller's last line marks the response complete
    when the rest of the body has already arrived.

    Raises (push, iterating):
        TooLarge: the body passed `limit` bytes.
        http.client.IncompleteRead: the chunked framing is broken.
    """

    def __init__(self, response: http.client.HTTPResponse, limit: int) -> None:
        assert response.fp is not None
        self.response = response
        self.fp: io.BufferedReader = response.fp
        self.lines: deque[bytes] = deque()
        self.ended = False
        self._limit = limit
        self._seen = 0
        self._raw = b""
        self._partial = b""

    def push(self, data: bytes) -> None:
        """Takes bytes of the body; an empty `data` is its end (the connection closed)."""
        if not data:
            self.close_partial()
            return
        self._seen += len(data)
        if self._seen > self._limit:
            raise TooLarge(self.response.status)
        raw, partial, lines = self._raw + data, self._partial, self.lines
        while True:
            head = raw.find(b"\r\n")
            if head < 0:
                if len(raw) > _MAX_SIZE_LINE:
                    raise http.client.IncompleteRead(raw[:64])
                break
            size = _chunk_size(raw[:head])
            if size == 0:
                # NOTE: the last chunk; the trailer section ends with an empty line.
                self.ended = raw.find(b"\r\n\r\n", head) >= 0
                break
            end = head + 2 + size
            if len(raw) < end + 2:
                break
            *more, partial = (partial + raw[head + 2:end]).split(b"\n")
            # NOTE: the blank lines between events say nothing a reader of `data:` lines needs.
            lines.extend(filter(None, more))
            raw = raw[end + 2:]
        self._raw, self._partial = raw, partial
        if self.ended:
            self.close_partial()

    def close_partial(self) -> None:
        """Hands out a last line that had no line end."""
        if self._partial:
            self.lines.append(self._partial)
            self._partial = b""

    def __iter__(self) -> Iterator[bytes]:
        lines = self.lines
        while True:
            while lines:
                yield lines.popleft()
            if self.ended:
                return
            data = self.fp.read1(_READ)
            self.push(data)
            if not data:
                while lines:
                    yield lines.popleft()
                return

    def finish(self) -> None:
        """Marks the response complete (its connection reusable) when only blank lines and the
        terminating chunk were left of it and have arrived; else leaves it (the caller then
        drops the connection)."""
        if self.ended and not any(line.strip() for line in self.lines):
            self.response.close()


class StreamedAnswer:
    """What OpenAI's server-sent chunks add up to: the text (each piece passed on as it comes),
    the last chunk and the usage, and whether the answer ended (`data: [DONE]`, or a chunk's
    `finish_reason`)."""

    __slots__ = ("finished", "last", "on_delta", "parts", "started", "status", "usage")

    def __init__(self, on_delta: Callable[[str], None], status: int, started: float) -> None:
        self.on_delta = on_delta
        self.status = status
        self.started = started
        self.parts: list[str] = []
        self.last: dict[str, Any] = {}
        self.usage: dict[str, Any] = {}
        self.finished = False

    def line(self, line: bytes) -> bool:
        """Takes one line of the body; True at `data: [DONE]` (nothing more is read).

        Raises:
            ProviderFailure: a chunk that is not a chunk (`parse`).
            CallAbandoned: from on_delta (the job was taken away).
        """
        if not line.startswith(b"data:"):
            return False
        data = line[5:].strip()
        if data == b"[DONE]":
            self.finished = True
            return True
        try:
            # PERF: orjson, from the bytes: 2 us a chunk against 8 us for json's decode of the
            # text, paid twenty to a thousand times a call.
            chunk: Any = orjson.loads(data)
            choice = (chunk.get("choices") or [{}])[0]
            delta = choice.get("delta", {}).get("content") or ""
            if not isinstance(delta, str):
                raise TypeError("delta content is not a string")
            check_storable(delta)
        except (ValueError, LookupError, TypeError, AttributeError) as exc:
            raise unreadable(exc, data, self.status,
                             round((time.monotonic() - self.started) * 1000)) from exc
        self.last, self.usage = chunk, chunk.get("usage") or self.usage
        self.finished = self.finished or bool(choice.get("finish_reason"))
        if delta:
            self.parts.append(delta)
            self.on_delta(delta)
        return False


class _Reading:
    """One body the poller reads, and how its call learns that it ended."""

    __slots__ = ("abandoned", "body", "deadline", "direct", "done", "error", "fd", "handle", "idle",
                 "last", "reader")

    def __init__(self, body: ChunkedBody, reader: DeadlineReader,
                 handle: Callable[[bytes], bool]) -> None:
        self.body = body
        self.reader = reader
        self.handle = handle
        self.fd = reader.fd
        # PERF: copied once: the loop checks every reading's bounds four times a second, and
        # at 10,000 streams the reader's properties cost about 5 % of a worker's CPU.
        self.deadline = reader.deadline
        self.idle = reader.idle_timeout
        self.last = time.monotonic()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.abandoned = False
        # NOTE: read from the descriptor itself once http.client's buffer is empty (not TLS).
        self.direct = False


class StreamPoller:
    """Reads the chunked bodies of many streamed calls in one loop (one per process).

    `read` blocks its caller until the body ended (its terminating chunk, the handler's
    True, the connection's end) or failed, as a read in the caller's thread would, and raises
    what reading or the handler raised; TimeoutError past the call's deadline or its idle
    bound (checked every `check` seconds).
    """

    def __init__(self, epoll: Any, tick: float = 0.01, check: float = 0.25) -> None:
        self._epoll = epoll
        self._tick = tick
        self._check = check
        self._lock = threading.Lock()
        self._added: list[_Reading] = []
        self._readings: dict[int, _Reading] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self, body: ChunkedBody, handle: Callable[[bytes], bool]) -> None:
        """Reads `body` to its end, handing each line to `handle` (in the poller's thread).

        Raises:
            TimeoutError: the call's deadline or idle bound passed.
            Exception: whatever a read or `handle` raised.
        """
        reader = body.fp.raw
        assert isinstance(reader, DeadlineReader)
        reading = _Reading(body, reader, handle)
        reader.poll_mode(True)
        try:
            with self._lock:
                self._added.append(reading)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="sa-stream-poller",
                                                    daemon=True)
                    self._thread.start()
            self._wake.set()
            # NOTE: the loop ends a reading past its deadline; this bound only guards against
            # a loop that stopped.
            if not reading.done.wait(max(0.0, reading.deadline - time.monotonic())
                                     + _LOOP_SLACK):
                reading.error = TimeoutError("the stream poller did not end the reading")
                reading.abandoned = True
        finally:
            reader.poll_mode(False)
        if reading.error is not None:
            raise reading.error

    def _run(self) -> None:
        while True:
            try:
                self._loop()
            except Exception:
                # NOTE: never dies: every call of the process waits on this loop.
                log.exception("stream_poller.failed")
                time.sleep(self._tick)

    def _loop(self) -> None:
        next_check = time.monotonic() + self._check
        while True:
            with self._lock:
                added, self._added = self._added, []
            for reading in added:
                self._readings[reading.fd] = reading
                try:
                    self._epoll.register(reading.fd, select.EPOLLIN)
                except FileExistsError:
                    # NOTE: the descriptor of a socket closed while it was read, reused.
                    self._epoll.modify(reading.fd, select.EPOLLIN)
                # NOTE: what http.client's buffer already holds raises no event.
                self._drain(reading, polled=False)
            if not self._readings:
                self._wake.wait()
                self._wake.clear()
                continue
            for fd, _mask in self._epoll.poll(0):
                ready = self._readings.get(fd)
                if ready is not None:
                    self._drain(ready, polled=True)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + self._check
                self._expire(now)
            # NOTE: never a blocking epoll wait: under gevent it would stop every greenlet.
            self._wake.wait(self._tick)
            self._wake.clear()

    def _drain(self, reading: _Reading, polled: bool) -> None:
        """Reads what arrived for `reading` and hands on its lines; ends it at its end."""
        body, handle = reading.body, reading.handle
        try:
            first = True
            while True:
                data = self._recv(reading)
                if not data:
                    if data is None or not (first and polled):
                        if data is None and not reading.reader.tls:
                            # PERF: http.client's buffer is empty now: later reads go to the
                            # socket itself, past four layers of Python reads.
                            reading.direct = True
                        return
                    body.push(b"")
                    while body.lines:
                        handle(body.lines.popleft())
                    self._end(reading)
                    return
                first = False
                reading.last = time.monotonic()
                body.push(data)
                while body.lines:
                    if handle(body.lines.popleft()):
                        self._end(reading)
                        return
                if body.ended:
                    self._end(reading)
                    return
                if reading.direct and len(data) < _READ:
                    # PERF: the socket is empty (a read that would wait costs an exception);
                    # epoll tells when more comes.
                    return
        except Exception as exc:
            reading.error = exc
            self._end(reading)

    @staticmethod
    def _recv(reading: _Reading) -> bytes | None:
        """What arrived, b"" at the connection's end, None when nothing has (yet)."""
        if reading.direct:
            try:
                return os.read(reading.fd, _READ)
            except BlockingIOError:
                return None
        data = reading.body.fp.read1(_READ)
        return None if not data and reading.reader.blocked else data

    def _expire(self, now: float) -> None:
        for reading in list(self._readings.values()):
            idle = reading.idle
            if reading.abandoned:
                self._end(reading)
            elif now >= reading.deadline or (idle and now - reading.last >= idle):
                reading.error = TimeoutError("the call's deadline or idle bound has passed")
                self._end(reading)

    def _end(self, reading: _Reading) -> None:
        if self._readings.get(reading.fd) is reading:
            del self._readings[reading.fd]
            # NOTE: a socket closed meanwhile (a provider closed at shutdown) left epoll already.
            with contextlib.suppress(OSError):
                self._epoll.unregister(reading.fd)
        reading.done.set()


_POLLER: StreamPoller | None = None
_POLLER_LOCK = threading.Lock()


def poller() -> StreamPoller | None:
    """The process's poller (started on first use), or None where epoll is missing."""
    global _POLLER
    with _POLLER_LOCK:
        if _POLLER is None:
            epoll = _original_epoll()
            if epoll is None:
                return None
            _POLLER = StreamPoller(epoll)
        return _POLLER


def _original_epoll() -> Any:
    """A real epoll (gevent's patching removes select.epoll; the loop never blocks on it)."""
    try:
        from gevent import monkey
        if monkey.is_module_patched("select"):
            return monkey.get_original("select", "epoll")()
    except ImportError:
        pass
    factory = getattr(select, "epoll", None)
    return None if factory is None else factory()


def _chunk_size(line: bytes) -> int:
    try:
        return int(line.split(b";", 1)[0], 16)
    except ValueError:
        raise http.client.IncompleteRead(line[:64]) from None
