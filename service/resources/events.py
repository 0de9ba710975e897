"""GET /mission/events: Server-Sent Events of the caller's own job transitions."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import falcon
import psycopg
import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import Caller
from service.event_hub import EventHub, JobEvent, SubscriptionClosed, replay_events
from service.serialize import json_handler

__all__ = ["EVENT_NAME", "KEEPALIVE_SECONDS", "RETRY_MILLISECONDS", "MissionEvents"]

log = structlog.get_logger(__name__)

EVENT_NAME = "job.state_changed"

KEEPALIVE_SECONDS = 15.0
"""An idle stream gets a comment line this often, so proxies and load balancers keep it open."""

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
        self._frames: dict[JobEvent, bytes] = {}
        self._lock = threading.Lock()

    def frames(self, events: list[JobEvent]) -> bytes:
        out = []
        for event in events:
            frame = self._frames.get(event)
            if frame is None:
                frame = b"id: %d\nevent: %s\ndata: %s\n\n" % (
                    event.id, EVENT_NAME.encode(), _JSON.serialize(event.payload(), falcon.MEDIA_JSON))
                with self._lock:
                    self._frames[event] = frame
                    while len(self._frames) > self._size:
                        del self._frames[next(iter(self._frames))]
            out.append(frame)
        return b"".join(out)


def _last_event_id(req: falcon.Request) -> int | None:
    """The Last-Event-ID header (sent by a reconnecting EventSource), else `?last_event_id=`."""
    raw = req.get_header("Last-Event-ID")
    if raw is None or not raw.strip():
        return req.get_param_as_int("last_event_id", min_value=0)
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()):
        raise falcon.HTTPInvalidHeader("must be an event id (a non-negative integer)", "Last-Event-ID")
    return int(raw)


class MissionEvents:
    """Streams `job.state_changed` events of the caller's (org, user) jobs, resumable by id.

    Each stream is a subscription to the process's one EventHub; it holds no database
    connection (a Last-Event-ID replay borrows one per page).
    """

    def __init__(
        self,
        pool: ConnectionPool[DictConnection],
        hub: EventHub,
        keepalive: float = KEEPALIVE_SECONDS,
    ) -> None:
        self._pool = pool
        self._hub = hub
        self._keepalive = keepalive
        self._cache = _FrameCache()

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        """Answers 200 `text/event-stream` at once; replays missed events, then follows live ones."""
        last = _last_event_id(req)
        self._hub.ensure_started()
        resp.content_type = "text/event-stream; charset=utf-8"
        resp.cache_control = ["no-cache"]
        # NOTE: tells nginx-style proxies not to buffer the stream.
        resp.set_header("X-Accel-Buffering", "no")
        resp.stream = self._stream(req.context.caller, last)

    def _stream(self, caller: Caller, last: int | None) -> Iterator[bytes]:
        # NOTE: subscribing in here, not in on_get, so a stream the server never starts leaves
        # nothing behind; once started, the server's close() (when the client goes away, noticed
        # at the next write, a keepalive at the latest) runs the finally.
        sub = self._hub.subscribe(caller.org_id, caller.user_id)
        try:
            # NOTE: a first chunk right away, so the server sends the headers now.
            yield b"retry: %d\n\n" % RETRY_MILLISECONDS
            sent = last or 0
            if last is not None:
                for page in replay_events(self._pool, caller.org_id, caller.user_id, last,
                                          sub.start_after):
                    yield self._cache.frames(page)
                    sent = page[-1].id
            if sub.start_after > sent:
                # NOTE: an `id:` field alone dispatches nothing but moves the client's
                # Last-Event-ID, so a client that reconnects before its next event resumes here.
                sent = sub.start_after
                yield b"id: %d\n\n" % sent
            while True:
                events = sub.wait(self._keepalive)
                fresh = [event for event in events if event.id > sent]
                if fresh:
                    sent = fresh[-1].id
                    yield self._cache.frames(fresh)
                elif not events:
                    yield b": keepalive\n\n"
        except SubscriptionClosed as exc:
            log.info("sse.stream_closed", reason=exc.reason, org_id=caller.org_id,
                     user_id=caller.user_id)
        except psycopg.Error as exc:
            log.warning("sse.replay_failed", error=str(exc), org_id=caller.org_id,
                        user_id=caller.user_id)
        finally:
            self._hub.unsubscribe(sub)
