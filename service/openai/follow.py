"""Following one job's transitions and output deltas, for a streamed chat answer.

One registry per event hub (so per web process), fed by the hub's tap: the hub reads the event
log and the streamed attempts' text once for everyone, and hands each job's news to the streams
that follow it, whoever's stream it is. The chat route counts streams itself (waits.WaitGate),
so they take nothing from the SSE stream caps.
"""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from collections.abc import Sequence

from service.events.hub import EventHub
from service.events.model import Live
from service.events.subscription import Subscription

__all__ = ["JobFollowers"]


class JobFollowers:
    """The streams following each job, fed by `hub`."""

    def __init__(self, hub: EventHub) -> None:
        self._hub = hub
        self._lock = threading.Lock()
        self._followers: dict[uuid.UUID, set[Subscription]] = defaultdict(set)
        hub.add_tap(self._offer)

    def follow(self, job_id: uuid.UUID) -> Subscription:
        """A subscription to the job's news from now on.

        The caller has checked the job is its org's, reads the job once after following (news
        from before is not replayed), and always calls `unfollow`. Returns once the hub is
        ready, so that read sees every transition up to the hub's cursor and the hub delivers
        every later one.

        Raises:
            psycopg.OperationalError: the hub could not start reading.
        """
        config = self._hub.config
        sub = Subscription(0, None, b"", config.client_buffer, config.client_buffer_bytes,
                           lambda _sub: None)
        with self._lock:
            self._followers[job_id].add(sub)
        try:
            self._hub.wait_ready(self._hub.config.start_timeout)
        except BaseException:
            self.unfollow(job_id, sub)
            raise
        return sub

    def unfollow(self, job_id: uuid.UUID, sub: Subscription) -> None:
        """Forgets a follow (idempotent)."""
        with self._lock:
            followers = self._followers.get(job_id)
            if followers is not None:
                followers.discard(sub)
                if not followers:
                    del self._followers[job_id]
        sub.close("unsubscribed")

    def _offer(self, items: Sequence[Live]) -> None:
        """The hub's tap: each item to its job's followers; one too far behind is closed."""
        with self._lock:
            if not self._followers:
                return
            for item in items:
                for sub in self._followers.get(item.job_id, ()):
                    if not sub.offer([item], item.size):
                        sub.close("too far behind")
