"""One client's event stream, as the WSGI body: its replay, then its live events, frame by frame."""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Generator, Iterator, Sequence

import falcon
import psycopg
import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from service.events.model import JobEvent, Live, OutputDelta
from service.events.replay import replay_events
from service.events.subscription import Subscription, SubscriptionClosed
from service.serialize import json_handler

__all__ = ["DELTA_EVENT_NAME", "EVENT_NAME", "RETRY_MILLISECONDS", "EventStream", "FrameCache"]

log = structlog.get_logger(__name__)

EVENT_NAME = "job.state_changed"
DELTA_EVENT_NAME = "job.output_delta"

RETRY_MILLISECONDS = 2000
"""How long an EventSource waits before it reconnects (the `retry:` field)."""

_JSON = json_handler()


class FrameCache:
    """Each event's SSE frame, encoded once per process however many streams carry it.

    PERF: with hundreds of streams of one user, encoding per stream was most of the fan-out's
    cost. Keyed by the whole event (not its id), so reused ids never serve a stale frame. It
    keeps at most `size` frames and `max_bytes` bytes, the oldest going first.
    """

    def __init__(self, size: int = 4096, max_bytes: int = 8 * 1024 * 1024) -> None:
        self._size = size
        self._max_bytes = max_bytes
        self._frames: dict[Live, bytes] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def frames(self, events: Sequence[Live]) -> bytes:
        """Returns the frames of `events`, in order, as one chunk."""
        out = []
        for event in events:
            frame = self._frames.get(event)
            if frame is None:
                data = _JSON.serialize(event.payload(), falcon.MEDIA_JSON)
                # NOTE: a delta has no id: it is not in the log, and must not move Last-Event-ID.
                frame = (b"event: %s\ndata: %s\n\n" % (DELTA_EVENT_NAME.encode(), data)
                         if isinstance(event, OutputDelta) else
                         b"id: %d\nevent: %s\ndata: %s\n\n" % (event.id, EVENT_NAME.encode(), data))
                with self._lock:
                    if event not in self._frames:
                        self._frames[event] = frame
                        self._bytes += len(frame)
                    while len(self._frames) > self._size or self._bytes > self._max_bytes:
                        self._bytes -= len(self._frames.pop(next(iter(self._frames))))
            out.append(frame)
        return b"".join(out)


def _client_gone(sock: socket.socket | None) -> bool:
    """Whether the client closed its end: an SSE client sends nothing after its request, so a
    readable socket with nothing to read is one that was shut (or reset)."""
    if sock is None:
        return False
    # NOTE: poll, not select: a process with 1000 connections has descriptors past select's 1024.
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    try:
        if not poller.poll(0):
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class EventStream:
    """The response body of one stream; its close() always frees the subscription.

    In order: a `retry:` frame at once (so the server sends the headers now), the replay of
    `(last_event_id, start]` (at most `replay_limit` events; past it the stream ends and the
    client reconnects for the next part), then every live event, with a keepalive comment
    whenever `keepalive` seconds pass without one. The replay is read a page at a time
    (`replay_page_bytes`, `text_chars`), and the next page only once the client took the last
    one: a client that does not read holds one bounded page, never its whole backlog.

    NOTE: a WSGI server calls close() even when it never iterated the body (the client left
    first), which a bare generator would ignore; the subscription (and its cap slot) would leak.
    """

    def __init__(self, pool: ConnectionPool[DictConnection], sub: Subscription,
                 last_event_id: int | None, sock: socket.socket | None, *, keepalive: float,
                 replay_limit: int, replay_page_bytes: int, text_chars: int,
                 cache: FrameCache) -> None:
        self._pool = pool
        self._replay_page_bytes = replay_page_bytes
        self._text_chars = text_chars
        self._sub = sub
        self._last = last_event_id
        self._sock = sock
        self._keepalive = keepalive
        self._replay_limit = replay_limit
        self._cache = cache
        self._frames = self._stream()

    def __iter__(self) -> Iterator[bytes]:
        return self._frames

    def close(self) -> None:
        """Frees the subscription, then ends the frames (the WSGI server calls it once done)."""
        self._sub.leave()
        self._frames.close()

    def _stream(self) -> Generator[bytes, None, None]:
        sub = self._sub
        try:
            yield b"retry: %d\n\n" % RETRY_MILLISECONDS
            start = sub.wait_start(self._keepalive)
            while start is None:
                if _client_gone(self._sock):
                    return
                yield b": keepalive\n\n"
                start = sub.wait_start(self._keepalive)
            sent = self._last or 0
            if self._last is not None:
                sent = yield from self._replay(self._last, start)
                if sent < start:
                    # NOTE: the replay reached its bound: the stream ends here and the client's
                    # EventSource reconnects after `retry` with the last id it got, for the next
                    # part. Every event arrives, in order, at most SA_SSE_REPLAY_LIMIT a stream.
                    log.info("sse.replay_bounded", org_id=sub.org_id, user_id=sub.user_id,
                             sent=sent, upto=start)
                    return
            if start > sent:
                # NOTE: an `id:` field alone dispatches nothing but moves the client's
                # Last-Event-ID, so a client that reconnects before its next event resumes here.
                sent = start
                yield b"id: %d\n\n" % sent
            yield from self._live(sent)
        except SubscriptionClosed as exc:
            log.info("sse.stream_closed", reason=exc.reason, org_id=sub.org_id,
                     user_id=sub.user_id)
        except psycopg.Error as exc:
            log.warning("sse.replay_failed", error=str(exc), org_id=sub.org_id,
                        user_id=sub.user_id)
        finally:
            sub.leave()

    def _replay(self, last: int, upto: int) -> Generator[bytes, None, int]:
        """Yields the frames of `(last, upto]`, at most `replay_limit` events; returns the last id sent."""
        sent, budget = last, self._replay_limit
        for page in replay_events(self._pool, self._sub.org_id, self._sub.user_id, last, upto,
                                  page_size=min(500, budget), page_bytes=self._replay_page_bytes,
                                  text_chars=self._text_chars):
            page = page[:budget]
            yield self._cache.frames(page)
            sent, budget = page[-1].id, budget - len(page)
            if not budget:
                break
        return sent

    def _live(self, sent: int) -> Generator[bytes, None, None]:
        """Yields the subscription's events after `sent`, and keepalives; ends when the client left.

        Raises:
            SubscriptionClosed: the hub dropped the subscription.
        """
        while True:
            events = self._sub.wait(self._keepalive)
            fresh = [event for event in events
                     if isinstance(event, OutputDelta) or event.id > sent]
            if fresh:
                sent = max([sent] + [e.id for e in fresh if isinstance(e, JobEvent)])
                yield self._cache.frames(fresh)
            elif not events:
                if _client_gone(self._sock):
                    log.info("sse.client_gone", org_id=self._sub.org_id,
                             user_id=self._sub.user_id)
                    return
                yield b": keepalive\n\n"
