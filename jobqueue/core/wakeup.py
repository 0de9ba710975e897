"""Wake-up notifications, sent by each process after its commits, out of band and coalesced.

PERF: Postgres serialises notifying commits on one lock held through the commit's WAL flush, so
a NOTIFY inside every transition (enqueue, claim, finalize: three per job) capped the commit rate
of the whole database under steady arrivals. Here a transition only notes that a wake-up is due
(a lock and a flag, never I/O); one background thread per process and database sends them on a
connection of its own. Leading edge: when nothing was sent for `interval`, it sends at once, so
an idle worker hears of a new job as soon as the enqueue committed. Otherwise whatever
accumulated within the window goes out in one notifying transaction, so a burst of N
transitions costs a few notifying commits, not N.

Best effort: a wake-up lost to a broken connection (the next send reopens it) is covered by the
listeners' poll (SA_POLL_INTERVAL). Under gunicorn's gevent worker the thread is a greenlet and
the connection gevent-aware, so a request never waits for a send.
"""

from __future__ import annotations

import atexit
import math
import os
import threading
import time
from typing import Any

import psycopg
import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core.queries import job_event as q
from jobqueue.core.settings import notify_interval

__all__ = ["WakeupSender", "for_pool", "notify_with", "sender_for"]

log = structlog.get_logger(__name__)

# NOTE: distinct future due times kept per send; a job due later than these is found by the poll.
_MAX_DUES = 64
_CONNECT_TIMEOUT = 5


class WakeupSender:
    """Coalesces this process's wake-ups for one database and sends them from a background thread.

    `job_changed` and `job_queued` never block on the database and never raise. `sent` counts
    notifying transactions (for tests and benchmarks).
    """

    def __init__(self, conninfo: str, interval: float) -> None:
        """Prepares a sender; its thread starts with the first wake-up.

        Args:
            conninfo: libpq URI; a transaction-mode pooler will do (each send is one
                transaction, and NOTIFY takes effect at its commit).
            interval: seconds over which wake-ups are coalesced (`SA_NOTIFY_INTERVAL`).
        """
        if not (math.isfinite(interval) and interval >= 0):
            raise ValueError(f"interval must be a finite number of seconds >= 0, got {interval!r}")
        self.conninfo = conninfo
        self.interval = interval
        self.pid = os.getpid()
        self.sent = 0
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._changed = False
        self._queued_now = False
        self._dues: set[str] = set()
        self._last_sent = -math.inf
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None

    def job_changed(self) -> None:
        """A transition was committed: wake `sa_job_event` listeners (the SSE hubs)."""
        self._note(None, now=False)

    def job_queued(self, due: float | None = None) -> None:
        """A job became queued (a transition too): wake workers, now or when it falls due.

        Args:
            due: epoch seconds when it becomes claimable; None or past for now.
        """
        if due is not None and due > time.time():
            self._note(f"{due:.6f}", now=False)
        else:
            self._note(None, now=True)

    def _note(self, due: str | None, now: bool) -> None:
        with self._lock:
            self._changed = True
            self._queued_now = self._queued_now or now
            if due is not None and len(self._dues) < _MAX_DUES:
                self._dues.add(due)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sa-wakeup", daemon=True)
                self._thread.start()
            self._ready.set()
            leading = time.monotonic() - self._last_sent >= self.interval
        if leading:
            # PERF: a leading-edge wake-up goes out now rather than when this thread next waits:
            # under gevent (the web) this yields to the sender's greenlet, which starts its send
            # and yields back at its first network wait; in plain threads it hands over the GIL.
            time.sleep(0)

    def close(self, timeout: float = 2.0) -> None:
        """Sends what is pending, then stops the thread and closes the connection."""
        self._stopping.set()
        self._ready.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            self._ready.wait()
            # NOTE: leading edge: after a quiet `interval` this wait is zero and the first
            # wake-up goes at once; within the window the thread collects until it ends.
            pause = self._last_sent + self.interval - time.monotonic()
            if pause > 0 and not self._stopping.is_set():
                self._stopping.wait(pause)
            with self._lock:
                changed, queued_now, dues = self._changed, self._queued_now, self._dues
                self._changed, self._queued_now, self._dues = False, False, set()
                self._ready.clear()
            if changed:
                self._send(changed, queued_now, dues)
                self._last_sent = time.monotonic()
            if self._stopping.is_set():
                self._close_connection()
                return

    def _send(self, changed: bool, queued_now: bool, dues: set[str]) -> None:
        channels = ["sa_job_event"] if changed else []
        payloads = [""] if changed else []
        if queued_now:
            channels.append("sa_job_queued")
            payloads.append("")
        for due in sorted(dues):
            channels.append("sa_job_queued")
            payloads.append(due)
        params = {"channels": channels, "payloads": payloads}
        for attempt in (1, 2):
            fresh = self._conn is None
            try:
                self._connection().execute(q.JOB_EVENT_NOTIFY_MANY, params)
                self.sent += 1
                return
            except psycopg.Error as exc:
                self._close_connection()
                # NOTE: a connection that broke while idle (a server restart) gets one fresh try.
                if fresh or attempt == 2:
                    log.warning("wakeup.send_failed", error=str(exc).strip(),
                                channels=len(channels))
                    return

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            # NOTE: never prepared: a transaction-mode pooler (DATABASE_URL through PgBouncer)
            # runs the next send on another server session, where the prepared statement is
            # missing, and each send would fail once and reconnect. Its parse costs
            # microseconds next to the notifying commit.
            self._conn = psycopg.connect(self.conninfo, autocommit=True,
                                         connect_timeout=_CONNECT_TIMEOUT,
                                         application_name="sa-core wakeup",
                                         prepare_threshold=None)
        return self._conn

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def notify_with(conn: psycopg.Connection[Any], *, queued: bool) -> None:
    """Queues the wake-ups of the transitions `conn`'s open transaction writes, sent at its commit.

    For rare writers on a session of their own (the reclaim leader's rounds), where one more
    notifying commit now and then costs nothing and no sender thread is needed.
    """
    channels = ["sa_job_event", "sa_job_queued"] if queued else ["sa_job_event"]
    conn.execute(q.JOB_EVENT_NOTIFY_MANY, {"channels": channels, "payloads": [""] * len(channels)})


_senders: dict[str, WakeupSender] = {}
_senders_lock = threading.Lock()


def sender_for(conninfo: str) -> WakeupSender:
    """Returns this process's sender for `conninfo`, creating it on first use.

    One per process (a forked child gets its own) and database, so every transition committed by
    the process shares the coalescing window.
    """
    with _senders_lock:
        sender = _senders.get(conninfo)
        if sender is None or sender.pid != os.getpid():
            sender = _senders[conninfo] = WakeupSender(conninfo, notify_interval())
    return sender


def for_pool(pool: ConnectionPool[Any]) -> WakeupSender:
    """Returns the sender for the database `pool` connects to."""
    conninfo = pool.conninfo
    return sender_for(conninfo() if callable(conninfo) else conninfo)


@atexit.register
def _close_all() -> None:
    # NOTE: a short-lived process (the CLI's cancel-job, retry-job) commits and exits at once;
    # this sends its wake-ups before it goes.
    with _senders_lock:
        senders = [s for s in _senders.values() if s.pid == os.getpid()]
    for sender in senders:
        sender.close()
