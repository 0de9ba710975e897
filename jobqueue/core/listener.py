"""A LISTEN thread on one dedicated connection that hands each notification's payload to a callback."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import structlog

__all__ = ["NotificationListener"]

log = structlog.get_logger(__name__)

STOP_CHECK = 0.1
"""Seconds between the thread's looks at `stop` while no notification comes.
NOTE: the wait cannot be interrupted from another thread; at 1 s, every stop (a web process's
or a worker's shutdown, and hundreds of tests' teardowns) waited up to a second. A look is a
poll of an idle socket."""


class NotificationListener:
    """Runs `listen` (a LISTEN statement) and hands each payload to `on_notify`; reconnects with backoff.

    LISTEN needs a session of its own (never a pooled or PgBouncer transaction-mode connection),
    hence the dedicated connection to `SA_DIRECT_DATABASE_URL`. After a reconnect `on_reconnect`
    runs, since notifications sent while disconnected are lost and the consumer must re-read.
    """

    def __init__(
        self,
        conninfo: str,
        listen: str,
        on_notify: Callable[[str], None],
        on_reconnect: Callable[[], None] | None = None,
        max_backoff: float = 5.0,
    ) -> None:
        self._conninfo = conninfo
        self._listen = listen
        self._on_notify = on_notify
        self._on_reconnect = on_reconnect
        self._max_backoff = max_backoff
        self._stopping = threading.Event()
        self.listening = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sa-listener", daemon=True)

    def start(self) -> NotificationListener:
        """Starts the thread; returns self."""
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stops listening; the thread notices within STOP_CHECK seconds."""
        self._stopping.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        backoff = 0.1
        first = True
        while not self._stopping.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True) as conn:
                    conn.execute(self._listen)
                    self.listening.set()
                    backoff = 0.1
                    if not first and self._on_reconnect is not None:
                        self._on_reconnect()
                    first = False
                    self._consume(conn)
            except psycopg.OperationalError as exc:
                self.listening.clear()
                log.warning("listener.disconnected", error=str(exc), retry_in=backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff)

    def _consume(self, conn: psycopg.Connection[Any]) -> None:
        while not self._stopping.is_set():
            for notify in conn.notifies(timeout=STOP_CHECK):
                try:
                    self._on_notify(notify.payload)
                except Exception:
                    log.exception("listener.callback_failed")
