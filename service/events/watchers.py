"""Requests waiting for a job to end (`Prefer: wait=N`), woken by the hub's delivered events."""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from collections.abc import Sequence

from jobqueue.core.states import TERMINAL
from service.events.model import JobEvent

__all__ = ["JobWatchers"]


class JobWatchers:
    """Each watch is a threading.Event, set when the hub delivers the job's move to a terminal
    state: a waiting request holds that event, never a pool connection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watchers: dict[uuid.UUID, set[threading.Event]] = defaultdict(set)

    @property
    def count(self) -> int:
        """Jobs some request is waiting on."""
        with self._lock:
            return len(self._watchers)

    def watch(self, job_id: uuid.UUID) -> threading.Event:
        """Returns an event set once the job reaches a terminal state; always `unwatch` it."""
        finished = threading.Event()
        with self._lock:
            self._watchers[job_id].add(finished)
        return finished

    def unwatch(self, job_id: uuid.UUID, finished: threading.Event) -> None:
        """Forgets a watch (idempotent)."""
        with self._lock:
            watchers = self._watchers.get(job_id)
            if watchers is not None:
                watchers.discard(finished)
                if not watchers:
                    del self._watchers[job_id]

    def notify(self, events: Sequence[JobEvent]) -> None:
        """Sets the watch of every job that `events` move to a terminal state."""
        with self._lock:
            if not self._watchers:
                return
            for event in events:
                if event.to_state in TERMINAL:
                    for finished in self._watchers.get(event.job_id, ()):
                        finished.set()
