"""The due times of scheduled jobs a worker has heard of, so its claim loop wakes for the soonest."""

from __future__ import annotations

import bisect
import threading

__all__ = ["DueTimes"]


class DueTimes:
    """Due times (time.monotonic()), soonest first; safe to share between threads.

    At most `keep` are held, the latest dropped past it: the worker asks the database for the
    next one whenever a poll ends idle, so a dropped one is learnt again.
    """

    def __init__(self, keep: int = 256) -> None:
        self._keep = keep
        self._dues: list[float] = []
        self._lock = threading.Lock()

    def expect(self, due: float) -> None:
        """Remembers one due time."""
        with self._lock:
            bisect.insort(self._dues, due)
            del self._dues[self._keep:]

    def sleep_for(self, now: float, longest: float) -> float:
        """Seconds to sleep from `now`: 0 when a due time has passed (those are forgotten), else
        until the soonest, at most `longest`."""
        with self._lock:
            past = bisect.bisect_right(self._dues, now)
            if past:
                del self._dues[:past]
                return 0.0
            return min(longest, self._dues[0] - now) if self._dues else longest
