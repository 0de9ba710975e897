"""One run's control: the race between its job thread and whoever finds the job taken away.

The heartbeat and the departure watch (jobqueue/runtime/worker.py) abandon a run whose job is
no longer ours; the provider call registers how to cut its connection, so an abandon closes it
at once instead of waiting for the answer (a provider bills every token it generates).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["CallAbandoned", "RunControl"]


class CallAbandoned(Exception):
    """The job stopped being ours mid-call (cancelled, reclaimed): the call is given up."""


class RunControl:
    """Settles the race between a job's thread and the watcher that finds its claim gone.

    Once the thread starts finishing, the job can no longer be abandoned (the conditional
    finalize decides); once it is abandoned, the thread drops its result and its provider
    call, if one is attached, is cut. `on_finishing` runs once the provider call is over and the
    finalize begins.
    """

    # PERF: one lock for every run of the process, held for a few bytecodes: a lock per job cost
    # about 5 % of a gevent worker's CPU at 2,048 calls in flight (creating a gevent lock is dear).
    _lock = threading.Lock()

    def __init__(self, on_finishing: Callable[[], None] | None = None) -> None:
        self._abandoned = False
        self._finishing = False
        self._on_finishing = on_finishing
        self._cut: Callable[[], None] | None = None

    @property
    def abandoned(self) -> bool:
        """True once the job was abandoned."""
        return self._abandoned

    def abandon(self) -> bool:
        """Marks the job abandoned and cuts its call; False when its finalize has already begun."""
        # NOTE: the cut runs under the lock (a shutdown() syscall, it never blocks), so once
        # `detach` returns no late cut can reach the connection this thread reuses next.
        with self._lock:
            if not self._finishing and not self._abandoned:
                self._abandoned = True
                if self._cut is not None:
                    self._cut()
                    self._cut = None
            return self._abandoned

    def attach(self, cut: Callable[[], None]) -> None:
        """Registers how to cut the call now in flight; cuts at once when already abandoned."""
        with self._lock:
            if self._abandoned:
                cut()
            else:
                self._cut = cut

    def detach(self) -> None:
        """Forgets the call's cut: its connection may serve this thread's next job."""
        with self._lock:
            self._cut = None

    def begin_finish(self) -> bool:
        """Marks the job finishing; False when it was abandoned first."""
        with self._lock:
            if not self._abandoned:
                self._finishing = True
                self._cut = None
            finishing = self._finishing
        if finishing and self._on_finishing is not None:
            self._on_finishing()
        return finishing
