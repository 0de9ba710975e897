"""Turns for one token's page reads and sign-ins in a web process: one at a time, each followed by
a rest in proportion to its length, so one token takes at most `share` of a process's time
however many clients it runs.

A cheap 429 is no defence against a client that ignores Retry-After: it loops on the refusal and
the refusals take the process's time instead (measured: 99,637 refused pages in 40 s). Here a
token's excess requests wait for their turn instead, which costs the token (its answers come
later) and not the process (a waiting request holds no database connection and no CPU: a
greenlet under gevent). Only past `queue` waiting requests or `wait` seconds is it refused::

    started = turns.take(req.context.token_digest)   # None: refused
    ...                                              # the read, its body rendered
    turns.give(req.context.token_digest, started)

NOTE: the rest is measured in wall time, so a process that is slow for everybody makes every
token's rests longer: a flood gives way first when it matters most.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Turns"]

SWEEP_AT = 4096
"""Lanes kept before idle ones are dropped; a lane is a few hundred bytes."""


@dataclass(slots=True)
class _Lane:
    """One token's turn: taken or not, rested until `free_at`, and how many wait for it."""

    ready: threading.Condition
    busy: bool = False
    free_at: float = 0.0
    waiting: int = 0


class Turns:
    """The turns of every token in one web process."""

    def __init__(self, share: float, queue: int, wait: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < share <= 1 or queue < 0 or wait < 0:
            raise ValueError("share must be in (0, 1], queue and wait at least 0")
        self._rest_per_second = 1 / share - 1
        self._queue = queue
        self._wait = wait
        self._clock = clock
        self._lock = threading.Lock()
        self._lanes: dict[bytes, _Lane] = {}

    def take(self, token: bytes) -> float | None:
        """Waits for `token`'s turn and returns when it started; None when `queue` requests of
        the token already wait, or its turn did not come within `wait` seconds."""
        with self._lock:
            lane = self._lane(token)
            if lane.waiting >= self._queue and (lane.busy or lane.free_at > self._clock()):
                return None
            lane.waiting += 1
            deadline = self._clock() + self._wait
            try:
                while True:
                    now = self._clock()
                    if not lane.busy and lane.free_at <= now:
                        lane.busy = True
                        return now
                    until = deadline if lane.busy else min(deadline, lane.free_at)
                    if until <= now:
                        return None
                    lane.ready.wait(until - now)
            finally:
                lane.waiting -= 1

    def give(self, token: bytes, started: float) -> None:
        """Ends `token`'s turn begun at `started`; the next one starts after its rest."""
        with self._lock:
            lane = self._lanes[token]
            now = self._clock()
            lane.busy = False
            lane.free_at = now + (now - started) * self._rest_per_second
            # NOTE: all, not one: a waiter past its deadline leaves without passing the turn on.
            lane.ready.notify_all()

    def _lane(self, token: bytes) -> _Lane:
        lane = self._lanes.get(token)
        if lane is None:
            if len(self._lanes) >= SWEEP_AT:
                now = self._clock()
                for key in [k for k, v in self._lanes.items()
                            if not v.busy and not v.waiting and v.free_at <= now]:
                    del self._lanes[key]
            lane = self._lanes[token] = _Lane(threading.Condition(self._lock))
        return lane
