"""GET /mission/events: Server-Sent Events of the caller's own job transitions."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Generator, Iterator, Sequence

import falcon
import psycopg
import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import Caller
from service.event_hub import (
    EventHub,
    JobEvent,
    Live,
    OutputDelta,
    StreamLimitExceeded,
    Subscription,
    SubscriptionClosed,
    replay_events,
)
from service.serialize import json_handler
from service.validation import parse_last_event_id, parse_org_wide

__all__ = ["DELTA_EVENT_NAME", "EVENT_NAME", "RETRY_MILLISECONDS", "MissionEvents"]

log = structlog.get_logger(__name__)

EVENT_NAME = "job.state_changed"
DELTA_EVENT_NAME = "job.output_delta"

RETRY_MILLISECONDS = 2000
"""How long an EventSource waits before it reconnects (the `retry:` field)."""

_JSON = json_handler()


class _FrameCache:
    """Each event's SSE frame, encoded once per process however many streams carry it.

    PERF: with hundreds of streams of one user, encoding per stream was most of the fan-out's
    cost. Keyed by the whole event (not its id), so reused ids never serve a stale frame.
    """

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._frames: dict[Live, bytes] = {}
        self._lock = threading.Lock()

    def frames(self, events: Sequence[Live]) -> bytes:
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
                    self._frames[event] = frame
                    while len(self._frames) > self._size:
                        del self._frames[next(iter(self._frames))]
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


class _EventStream:
    """The response body: the stream's frames, and a close() that always frees its subscription.

    NOTE: a WSGI server calls close() even when it never iterated the body (the client left
    first), which a bare generator would ignore; the subscription (and its cap slot) would leak.
    """

    def __init__(self, frames: Iterator[bytes], hub: EventHub, sub: Subscription) -> None:
        self._frames = frames
        self._hub = hub
        self._sub = sub

    def __iter__(self) -> Iterator[bytes]:
        return self._frames

    def close(self) -> None:
        """Frees the subscription, then ends the frames (the WSGI server calls it once done)."""
        self._hub.unsubscribe(self._sub)
        close = getattr(self._frames, "close", None)
        if close is not None:
            close()


class MissionEvents:
    """Streams `job.state_changed` events of the caller's jobs (or org's), resumable by id.

    Each stream is a subscription to the process's one EventHub; it holds no database
    connection (a Last-Event-ID replay borrows one per page). Streams are capped per token and
    per process (SA_SSE_MAX_STREAMS_PER_TOKEN, SA_SSE_MAX_STREAMS; 429 past them), end within
    SA_SSE_TOKEN_CHECK seconds of their token's revoke or expiry, and notice a client that left
    within about SA_SSE_KEEPALIVE seconds.
    """

    def __init__(
        self,
        pool: ConnectionPool[DictConnection],
        hub: EventHub,
        keepalive: float = 15.0,
        replay_limit: int = 1000,
    ) -> None:
        self._pool = pool
        self._hub = hub
        self._keepalive = keepalive
        self._replay_limit = replay_limit
        self._cache = _FrameCache()

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers 200 `text/event-stream` at once; replays missed events, then follows live ones.

        Raises:
            falcon.HTTPTooManyRequests: the token or the process has its cap of streams.
        """
        last = parse_last_event_id(req)
        org_wide = parse_org_wide(req.get_param("scope"))
        caller: Caller = req.context.caller
        self._hub.ensure_started()
        try:
            sub = self._hub.subscribe(caller.org_id, None if org_wide else caller.user_id,
                                      req.context.token_digest)
        except StreamLimitExceeded as exc:
            raise falcon.HTTPTooManyRequests(title="Too many event streams",
                                             description=exc.description,
                                             retry_after=exc.retry_after) from None
        sock = req.env.get("gunicorn.socket")
        if isinstance(sock, socket.socket) and hasattr(socket, "TCP_USER_TIMEOUT"):
            # NOTE: a client that vanished without a FIN leaves our keepalives unacknowledged;
            # the kernel then drops the connection after one keepalive interval, so the next
            # write fails and the stream ends instead of waiting for TCP's minutes of retries.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                                max(1, int(self._keepalive * 1000)))
        resp.content_type = "text/event-stream; charset=utf-8"
        resp.cache_control = ["no-cache"]
        # NOTE: tells nginx-style proxies not to buffer the stream.
        resp.set_header("X-Accel-Buffering", "no")
        resp.stream = _EventStream(
            self._stream(sub, last, sock if isinstance(sock, socket.socket) else None),
            self._hub, sub)

    def _stream(self, sub: Subscription, last: int | None,
                sock: socket.socket | None) -> Iterator[bytes]:
        try:
            # NOTE: a first chunk right away, so the server sends the headers now.
            yield b"retry: %d\n\n" % RETRY_MILLISECONDS
            start = sub.wait_start(self._keepalive)
            while start is None:
                if _client_gone(sock):
                    return
                yield b": keepalive\n\n"
                start = sub.wait_start(self._keepalive)
            sent = last or 0
            if last is not None:
                sent = yield from self._replay(sub, last, start)
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
            while True:
                events = sub.wait(self._keepalive)
                fresh = [event for event in events
                         if isinstance(event, OutputDelta) or event.id > sent]
                if fresh:
                    sent = max([sent] + [e.id for e in fresh if isinstance(e, JobEvent)])
                    yield self._cache.frames(fresh)
                elif not events:
                    if _client_gone(sock):
                        log.info("sse.client_gone", org_id=sub.org_id, user_id=sub.user_id)
                        return
                    yield b": keepalive\n\n"
        except SubscriptionClosed as exc:
            log.info("sse.stream_closed", reason=exc.reason, org_id=sub.org_id,
                     user_id=sub.user_id)
        except psycopg.Error as exc:
            log.warning("sse.replay_failed", error=str(exc), org_id=sub.org_id,
                        user_id=sub.user_id)
        finally:
            self._hub.unsubscribe(sub)

    def _replay(self, sub: Subscription, last: int, upto: int) -> Generator[bytes, None, int]:
        """Yields the frames of `(last, upto]`, at most `replay_limit` events; returns the last id sent."""
        sent, budget = last, self._replay_limit
        for page in replay_events(self._pool, sub.org_id, sub.user_id, last, upto,
                                  page_size=min(500, budget)):
            page = page[:budget]
            yield self._cache.frames(page)
            sent, budget = page[-1].id, budget - len(page)
            if not budget:
                break
        return sent
