"""Under gevent, psycopg's waits take a socket's readiness at once instead of after a trip round the hub.

psycopg drives every exchange with the server as a generator that asks to wait for its socket
(readable, writable) before each step, and under gevent each wait is a gevent poll: a switch to
the hub, which first runs every other greenlet that is ready. A step whose socket is already
ready (a query to send on a writable socket, results that have arrived) still waited a whole
round of the worker's job greenlets. A claim's pipeline waits so between its statements, and its
server session sat in ClientRead, between the plan settings and the claim, for much of a
burn-down (pg_stat_activity, docs/performance.md).
"""

from __future__ import annotations

import select
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from psycopg import Connection
from psycopg.abc import PQGen
from psycopg.rows import DictRow
from psycopg.waiting import Ready, Wait

__all__ = ["ReadyFirstConnection"]

RV = TypeVar("RV")

_EVENTS = {Wait.R: select.POLLIN, Wait.W: select.POLLOUT, Wait.RW: select.POLLIN | select.POLLOUT}


def _unpatched_poll() -> Callable[[], Any] | None:
    """The standard library's select.poll when gevent has patched it, else None."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("select"):
        return None
    poll: Callable[[], Any] = monkey.get_original("select", "poll")
    return poll


def _ready_first(gen: PQGen[RV], fileno: int, poll: Any) -> PQGen[RV]:
    """`gen`, with each wait whose socket is ready now answered at once (a poll that never
    blocks); only the others reach psycopg's wait, and the hub.

    A socket in error (neither readable nor writable) is left to psycopg's wait, which reports it.
    """
    events = 0
    try:
        wanted = next(gen)
        while True:
            if _EVENTS[wanted] != events:
                events = _EVENTS[wanted]
                poll.register(fileno, events)
            ready = 0
            for _fd, event in poll.poll(0):
                if event & select.POLLIN:
                    ready |= Ready.R
                if event & select.POLLOUT:
                    ready |= Ready.W
            if not ready:
                ready = yield wanted
            wanted = gen.send(ready)
    except StopIteration as stop:
        result: RV = stop.value
        return result


class ReadyFirstConnection(Connection[DictRow]):
    """A connection whose waits skip the hub when its socket is ready (under gevent only)."""

    def wait(self, gen: PQGen[RV], *args: Any, **kwargs: Any) -> RV:
        poll = _unpatched_poll()
        if poll is not None:
            gen = _ready_first(gen, self.pgconn.socket, poll())
        return super().wait(gen, *args, **kwargs)
