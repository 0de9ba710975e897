"""GET /mission/events: Server-Sent Events of the caller's own job transitions."""

from __future__ import annotations

import contextlib
import socket

import falcon
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import Caller
from service.events.fanout import StreamLimitExceeded
from service.events.hub import EventHub
from service.events.stream import EventStream, FrameCache
from service.parsers import parse_last_event_id, parse_org_wide

__all__ = ["MissionEvents"]


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
        page_bytes: int = 1_048_576,
    ) -> None:
        self._pool = pool
        self._hub = hub
        self._keepalive = keepalive
        self._replay_limit = replay_limit
        self._page_bytes = page_bytes
        self._cache = FrameCache()

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
        sock = sock if isinstance(sock, socket.socket) else None
        if sock is not None and hasattr(socket, "TCP_USER_TIMEOUT"):
            # NOTE: a client that vanished without a FIN leaves our keepalives unacknowledged;
            # the kernel then drops the connection after one keepalive interval, so the next
            # write fails and the stream ends instead of waiting for TCP's minutes of retries.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                                max(1, int(self._keepalive * 1000)))
        sub.attach(sock)
        resp.content_type = "text/event-stream; charset=utf-8"
        resp.cache_control = ["no-cache"]
        # NOTE: tells nginx-style proxies not to buffer the stream.
        resp.set_header("X-Accel-Buffering", "no")
        resp.stream = EventStream(self._pool, sub, last, sock, keepalive=self._keepalive,
                                  replay_limit=self._replay_limit,
                                  replay_page_bytes=self._page_bytes,
                                  text_chars=self._hub.config.text_chars, cache=self._cache)
