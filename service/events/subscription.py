"""One stream's bounded buffer of live events: the hub fills it, the client's stream drains it."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import deque
from collections.abc import Callable, Sequence

from service.events.model import Key, Live

__all__ = ["Subscription", "SubscriptionClosed"]


class SubscriptionClosed(Exception):
    """The hub dropped a subscription: it fell too far behind, its token stopped acting, or the
    hub stopped."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Subscription:
    """Every event the hub delivers after `start_after` for its key arrives here, in id order.

    `start_after` is None until the hub knows its cursor (`wait_start`). A client too slow to
    keep at most `capacity` events and `capacity_bytes` bytes waiting is closed instead of
    slowing the hub (or anyone else) or making the process hold its backlog; it resumes with
    Last-Event-ID.
    """

    def __init__(self, org_id: int, user_id: int | None, token: bytes, capacity: int,
                 capacity_bytes: int, forget: Callable[[Subscription], None]) -> None:
        self.org_id = org_id
        self.user_id = user_id
        self.token = token
        self.start_after: int | None = None
        self._capacity = capacity
        self._capacity_bytes = capacity_bytes
        self._forget = forget
        self._buffer: deque[Live] = deque()
        self._bytes = 0
        self._cond = threading.Condition(threading.Lock())
        self._closed: str | None = None
        self._sock: socket.socket | None = None

    @property
    def key(self) -> Key:
        """The (org, user), or (org, None) for an org-wide stream, whose events it receives."""
        return (self.org_id, self.user_id)

    def start(self, after: int) -> None:
        """Sets the point from which live events arrive (the hub's cursor when it learned it)."""
        with self._cond:
            self.start_after = after
            self._cond.notify_all()

    def wait_start(self, timeout: float) -> int | None:
        """Returns `start_after`, waiting up to `timeout` for the hub to know it.

        Raises:
            SubscriptionClosed: the hub dropped this subscription.
        """
        with self._cond:
            if self.start_after is None and self._closed is None:
                self._cond.wait(timeout)
            if self._closed is not None:
                raise SubscriptionClosed(self._closed)
            return self.start_after

    def wait(self, timeout: float) -> list[Live]:
        """Returns the buffered events, waiting up to `timeout` for one; [] when none came.

        Raises:
            SubscriptionClosed: the hub dropped this subscription.
        """
        with self._cond:
            if not self._buffer and self._closed is None:
                self._cond.wait(timeout)
            if self._closed is not None:
                raise SubscriptionClosed(self._closed)
            events = list(self._buffer)
            self._buffer.clear()
            self._bytes = 0
        return events

    def offer(self, events: Sequence[Live], size: int) -> bool:
        """Appends events (`size` bytes in all) without blocking; False (and nothing appended)
        when they do not fit."""
        with self._cond:
            if self._closed is not None:
                return True
            if (len(self._buffer) + len(events) > self._capacity
                    or self._bytes + size > self._capacity_bytes):
                return False
            self._buffer.extend(events)
            self._bytes += size
            self._cond.notify_all()
        return True

    def attach(self, sock: socket.socket | None) -> None:
        """Names the client's connection, which a close by the hub then shuts."""
        self._sock = sock

    def close(self, reason: str) -> None:
        """Ends the subscription (the hub's side); a waiting `wait()` raises SubscriptionClosed.

        NOTE: a stream stuck writing to a client that does not read never reaches its next
        `wait()`; shutting its connection fails that write, so a web process told to stop (or a
        client dropped for falling behind) frees its greenlet at once, not after
        gunicorn's graceful_timeout.
        """
        self._end(reason)
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def leave(self) -> None:
        """Ends the subscription from the client's side: frees its place in the hub (idempotent)."""
        self._forget(self)
        self._end("unsubscribed")

    def _end(self, reason: str) -> None:
        with self._cond:
            if self._closed is None:
                self._closed = reason
            self._cond.notify_all()
