"""A worker's gate in front of each model route: shared pauses, configured limits, 429s.

The pauses live in Postgres (jobqueue/engine/throttle.py); this keeps a copy refreshed at most
every `refresh` seconds, so checking a route before a call costs no round trip, and a worker
whose every route is paused skips its claims until one resumes.
"""

from __future__ import annotations

import threading
import time

import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core import metrics
from jobqueue.core.db import DictConnection
from jobqueue.core.routes import Route
from jobqueue.engine import throttle

__all__ = ["RouteGate"]

log = structlog.get_logger(__name__)


class RouteGate:
    """Answers "may this route be called now?" for every job thread of one worker."""

    def __init__(self, pool: ConnectionPool[DictConnection], *, refresh: float,
                 window: float) -> None:
        """Args:
            pool: database pool.
            refresh: most seconds this worker's copy of the pauses may lag the database's.
            window: length of the RPM/TPM windows in seconds (60; shorter in tests).
        """
        self._pool = pool
        self._refresh = refresh
        self._window = window
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}
        self._read_at = -float("inf")

    def refresh(self) -> None:
        """Re-reads the pauses when the copy is older than `refresh` seconds."""
        now = time.monotonic()
        if now - self._read_at < self._refresh:
            return
        pauses = throttle.active_pauses(self._pool)
        with self._lock:
            self._read_at = now
            self._until = {route: now + seconds for route, seconds in pauses.items()}

    def paused_for(self, route: str) -> float:
        """Seconds left in the route's pause as last read (0: not paused)."""
        with self._lock:
            until = self._until.get(route, 0.0)
        return max(0.0, until - time.monotonic())

    def all_paused(self, routes: list[Route]) -> bool:
        """True when no route of `routes` may be called now: claiming would only put jobs back."""
        self.refresh()
        return bool(routes) and all(self.paused_for(route.name) > 0 for route in routes)

    def admit(self, route: Route) -> float:
        """Seconds to wait before calling `route` (0: call now, and the call is counted).

        A route at its configured requests- or tokens-per-window limit is paused for every
        worker until the window ends.
        """
        waiting = self.paused_for(route.name)
        if waiting > 0 or not (route.rpm or route.tpm):
            return waiting
        left = throttle.take(self._pool, route.name, route.rpm, route.tpm, self._window)
        if left is None:
            return 0.0
        return self.pause(route, left, "limit")

    def pause(self, route: Route, seconds: float, reason: str) -> float:
        """Pauses `route` for every worker (a 429, or its limit reached); returns seconds left."""
        paused = throttle.pause(self._pool, route.name, seconds, reason)
        with self._lock:
            self._until[route.name] = time.monotonic() + paused.seconds
        if paused.started:
            metrics.ROUTE_THROTTLED.labels(route=route.name, reason=reason).inc()
            log.warning("route.throttled", route=route.name, reason=reason,
                        seconds=round(paused.seconds, 3))
        return paused.seconds

    def spent(self, route: Route, tokens: int) -> None:
        """Counts a call's reported tokens against the route's tokens-per-window limit."""
        if route.tpm and tokens:
            throttle.add_tokens(self._pool, route.name, tokens, self._window)
