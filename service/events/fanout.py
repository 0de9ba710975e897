"""The process's open streams by owner, with their caps, and the hand-out of each delivered page."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Sequence

import structlog

from service.events.model import JobEvent, Key, Live, OutputDelta
from service.events.subscription import Subscription

__all__ = ["Fanout", "StreamLimitExceeded"]

log = structlog.get_logger(__name__)


class StreamLimitExceeded(Exception):
    """A new stream would pass the per-token or the per-process cap; the client retries later."""

    def __init__(self, description: str, retry_after: int) -> None:
        super().__init__(description)
        self.description = description
        self.retry_after = retry_after


class Fanout:
    """Registers streams and hands each of them its owner's events, never blocking on one.

    NOTE: `cursor` (the id delivered last) moves under the same lock as the hand-out and the
    registration, so a new stream sees either all of a page (live) or none of it (replayed from
    the table), never half.
    """

    def __init__(self, client_buffer: int, client_buffer_bytes: int, max_streams: int,
                 max_streams_per_token: int, retry_after: int) -> None:
        self._client_buffer = client_buffer
        self._client_buffer_bytes = client_buffer_bytes
        self._max_streams = max_streams
        self._max_per_token = max_streams_per_token
        self._retry_after = retry_after
        self._lock = threading.Lock()
        self._subs: dict[Key, set[Subscription]] = defaultdict(set)
        self._per_token: dict[bytes, int] = defaultdict(int)
        self._cursor: int | None = None
        self._closed: str | None = None

    @property
    def cursor(self) -> int | None:
        """The id delivered last (every lower id is final); None until the hub is ready."""
        with self._lock:
            return self._cursor

    @property
    def count(self) -> int:
        """Open subscriptions."""
        with self._lock:
            return sum(len(subs) for subs in self._subs.values())

    def tokens(self) -> list[bytes]:
        """The token digests that have a stream open here."""
        with self._lock:
            return list(self._per_token)

    def subscribe(self, org_id: int, user_id: int | None, token: bytes) -> Subscription:
        """Registers a stream for (org, user), or the whole org when `user_id` is None.

        Raises:
            StreamLimitExceeded: the token, or this process, already has its cap of streams.
        """
        sub = Subscription(org_id, user_id, token, self._client_buffer,
                           self._client_buffer_bytes, self._forget)
        with self._lock:
            if sum(len(subs) for subs in self._subs.values()) >= self._max_streams:
                raise StreamLimitExceeded(
                    f"this process already serves {self._max_streams} event streams "
                    "(SA_SSE_MAX_STREAMS)", self._retry_after)
            if self._per_token[token] >= self._max_per_token:
                raise StreamLimitExceeded(
                    f"this token already has {self._max_per_token} open event streams here "
                    "(SA_SSE_MAX_STREAMS_PER_TOKEN); close one first", self._retry_after)
            if self._closed is not None:
                sub.close(self._closed)
                return sub
            if self._cursor is not None:
                sub.start(self._cursor)
            self._subs[sub.key].add(sub)
            self._per_token[token] += 1
        return sub

    def start(self, cursor: int) -> None:
        """Sets the cursor once the hub is ready, and starts every stream waiting for it."""
        with self._lock:
            self._cursor = cursor
            for group in self._subs.values():
                for sub in group:
                    sub.start(cursor)

    def restart(self) -> None:
        """Follows a sequence that went back to 0; open streams keep their subscriptions."""
        with self._lock:
            self._cursor = 0

    def deliver(self, events: Sequence[JobEvent]) -> None:
        """Hands a page of final events (in id order) to their streams; moves the cursor past it."""
        self._offer(events, events[-1].id)

    def deliver_deltas(self, deltas: Sequence[OutputDelta]) -> None:
        """Hands output deltas to their streams (they carry no id; the cursor stays)."""
        self._offer(deltas, None)

    def close_where(self, doomed: Callable[[Subscription], bool], reason: str) -> int:
        """Ends the streams `doomed` picks; returns how many."""
        with self._lock:
            subs = [sub for group in self._subs.values() for sub in group if doomed(sub)]
            for sub in subs:
                self._drop(sub)
        for sub in subs:
            sub.close(reason)
        return len(subs)

    def close_all(self, reason: str) -> None:
        """Ends every stream, and every one opened from now on."""
        with self._lock:
            self._closed = reason
        self.close_where(lambda _sub: True, reason)

    def _offer(self, items: Sequence[Live], cursor: int | None) -> None:
        by_key: dict[Key, list[Live]] = defaultdict(list)
        sizes: dict[Key, int] = defaultdict(int)
        for item in items:
            size = item.size
            for key in item.keys:
                by_key[key].append(item)
                sizes[key] += size
        dropped: list[Subscription] = []
        with self._lock:
            for key, batch in by_key.items():
                for sub in self._subs.get(key, ()):
                    if not sub.offer(batch, sizes[key]):
                        dropped.append(sub)
            for sub in dropped:
                self._drop(sub)
            if cursor is not None:
                self._cursor = cursor
        for sub in dropped:
            log.warning("sse.client_too_slow", org_id=sub.org_id, user_id=sub.user_id,
                        buffer=self._client_buffer, buffer_bytes=self._client_buffer_bytes)
            sub.close("too far behind")

    def _forget(self, sub: Subscription) -> None:
        with self._lock:
            self._drop(sub)

    def _drop(self, sub: Subscription) -> None:
        """Removes a subscription from the registry; the caller holds `_lock`."""
        group = self._subs.get(sub.key)
        if group is None or sub not in group:
            return
        group.discard(sub)
        if not group:
            del self._subs[sub.key]
        self._per_token[sub.token] -= 1
        if not self._per_token[sub.token]:
            del self._per_token[sub.token]
