"""The per-process event hub behind SSE: one reader of sa_job_event, fanned out in memory per caller."""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.listener import NotificationListener
from jobqueue.core.queries import job_event as q
from jobqueue.core.settings import Settings

__all__ = [
    "EventHub",
    "HubConfig",
    "JobEvent",
    "Subscription",
    "SubscriptionClosed",
    "close_all_streams",
    "replay_events",
]

log = structlog.get_logger(__name__)

Key = tuple[int, int]

# NOTE: how soon the hub looks again while an event is held back behind a gap (doubling up to
# the poll interval): gaps close when a short transaction commits, usually within milliseconds.
_RETRY_FIRST = 0.002

_STARTED: weakref.WeakSet[EventHub] = weakref.WeakSet()


def close_all_streams() -> None:
    """Ends every SSE stream of this process soon, e.g. when the web worker is told to stop.

    Safe to call from a signal handler: it only sets flags; each hub's reader closes the
    subscriptions (their clients reconnect, elsewhere, with Last-Event-ID).
    """
    for hub in list(_STARTED):
        hub.drain()


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One row of sa_job_event: a job's transition, in the log's id order."""

    id: int
    job_id: uuid.UUID
    prompt_id: uuid.UUID
    org_id: int
    created_by: int
    from_state: str | None
    to_state: str
    attempt: int
    error_kind: str | None
    response_id: uuid.UUID | None
    at: datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> JobEvent:
        """Builds an event from a row of JOB_EVENT_LIST_* (a dict row)."""
        return cls(**row)

    def payload(self) -> dict[str, Any]:
        """Returns what a client may see: everything but the owner, which is the client itself."""
        return {
            "id": self.id,
            "job_id": self.job_id,
            "prompt_id": self.prompt_id,
            "from_state": self.from_state,
            "to_state": self.to_state,
            "attempt": self.attempt,
            "error_kind": self.error_kind,
            "response_id": self.response_id,
            "at": self.at,
        }


class SubscriptionClosed(Exception):
    """The hub dropped a subscription: it fell too far behind, or the hub stopped."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Subscription:
    """One client's bounded buffer of live events; the hub fills it, the client's stream drains it.

    Every event the hub delivers after `start_after` for this (org, user) arrives here, in id
    order. A client too slow to keep `capacity` events or fewer waiting is closed instead of
    slowing the hub (or anyone else); it resumes with Last-Event-ID.
    """

    def __init__(self, org_id: int, user_id: int, start_after: int, capacity: int) -> None:
        self.org_id = org_id
        self.user_id = user_id
        self.start_after = start_after
        self._capacity = capacity
        self._buffer: deque[JobEvent] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._closed: str | None = None

    @property
    def key(self) -> Key:
        """The (org, user) whose events this subscription receives."""
        return (self.org_id, self.user_id)

    def wait(self, timeout: float) -> list[JobEvent]:
        """Returns the buffered events, waiting up to `timeout` for one; [] when none came.

        Raises:
            SubscriptionClosed: the hub dropped this subscription.
        """
        with self._cond:
            if not self._buffer and self._closed is None:
                self._cond.wait(timeout)
            if self._closed is not None:
                raise SubscriptionClosed(self._closed)
            events = list(self._buffer)
            self._buffer.clear()
        return events

    def close(self, reason: str) -> None:
        """Ends the subscription; a waiting `wait()` raises SubscriptionClosed at once."""
        with self._cond:
            if self._closed is None:
                self._closed = reason
            self._cond.notify_all()

    def offer(self, events: list[JobEvent]) -> bool:
        """Appends events without blocking; False (and nothing appended) when they do not fit."""
        with self._cond:
            if self._closed is not None:
                return True
            if len(self._buffer) + len(events) > self._capacity:
                return False
            self._buffer.extend(events)
            self._cond.notify_all()
        return True


@dataclass(frozen=True)
class HubConfig:
    """How often the hub reads without a notification, and how much it buffers per client."""

    poll_interval: float = 2.0
    page_size: int = 500
    client_buffer: int = 1000
    start_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.poll_interval <= 0 or self.start_timeout <= 0:
            raise ValueError("poll_interval and start_timeout must be positive")
        if self.page_size < 1 or self.client_buffer < 1:
            raise ValueError("page_size and client_buffer must be at least 1")


@dataclass(frozen=True)
class _Barrier:
    """Every id <= last_id is final once none of `xids` is still in flight."""

    last_id: int
    xids: frozenset[int]


class EventHub:
    """Reads sa_job_event once for the whole process and hands each event to its owner's streams.

    It reads when its LISTEN connection reports a notification (the payload is only a wake-up
    call; content always comes from the table), and every `poll_interval` regardless, which is
    all it does when `listen_conninfo` is None (SA_LISTEN=0, e.g. behind PgBouncer in
    transaction mode). Reads borrow the pool for a moment; clients never hold a connection.

    NOTE: gap-free delivery. Ids come from a sequence when a row is written, but rows become
    visible when their transaction commits, so id N+1 may be visible while N is not yet. The
    hub therefore delivers in strict id order and never passes an id that may still appear:
    it hands out a row only when it directly follows the last one delivered (`after + 1`), or
    when it lies at or below a proven horizon. The horizon comes from a barrier: read the
    sequence's last value L, THEN the xids of every transaction in flight in this database
    (backend_xid). A transaction holding an unpublished id <= L took it before L was read,
    after it got its xid (it wrote the sa_job row first), so it is in that list. Once a later
    look finds none of those xids in flight, every id <= L has committed or aborted for good;
    a read started after that look sees all the committed ones, and a missing id is an
    aborted one. The hub's cursor `after` is thus always a point below which nothing new can
    appear, which is what makes Last-Event-ID replay up to it exact (see `subscribe`).
    Ordinary traffic never waits for a barrier (ids arrive contiguously); only a gap does,
    for as long as the transactions then in flight take to end. This relies on the bigserial
    sequence's defaults (INCREMENT 1, CACHE 1): ids are handed out one at a time, in order.
    Comparing a per-row xid with pg_snapshot_xmin() would not do: xids and event ids are taken
    in different orders, and a running xid above the newest completed one does not lower xmin.
    """

    def __init__(
        self,
        pool: ConnectionPool[DictConnection],
        config: HubConfig,
        listen_conninfo: str | None = None,
    ) -> None:
        self._pool = pool
        self.config = config
        self._listen_conninfo = listen_conninfo
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._subs: dict[Key, set[Subscription]] = defaultdict(set)
        self._after: int | None = None
        self._init_target: int | None = None
        self._horizon = 0
        self._barrier: _Barrier | None = None
        self._ready = threading.Event()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._draining = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: NotificationListener | None = None
        # NOTE: reads completed; tests wait on it (like Worker.claim_rounds).
        self.rounds = 0

    @classmethod
    def from_settings(cls, pool: ConnectionPool[DictConnection], settings: Settings) -> EventHub:
        """Builds a hub that LISTENs on the direct database URL unless SA_LISTEN=0."""
        return cls(pool, HubConfig(poll_interval=settings.poll_interval),
                   settings.direct_database_url if settings.listen else None)

    @property
    def cursor(self) -> int | None:
        """The id delivered last (every lower id is final); None until the hub is ready."""
        with self._lock:
            return self._after

    @property
    def subscriber_count(self) -> int:
        """Open subscriptions."""
        with self._lock:
            return sum(len(subs) for subs in self._subs.values())

    def ensure_started(self) -> None:
        """Starts the listener and the reader on first use and waits until the hub is ready.

        Raises:
            psycopg.OperationalError: the hub could not read the event log within start_timeout.
        """
        with self._start_lock:
            if self._thread is None:
                if self._listen_conninfo is not None:
                    self._listener = NotificationListener(
                        self._listen_conninfo, q.JOB_EVENT_LISTEN, lambda _payload: self.wake(),
                        self.wake).start()
                    # NOTE: listening before the first read, so a commit right after it wakes us.
                    self._listener.listening.wait(self.config.start_timeout)
                self._thread = threading.Thread(target=self._run, name="sa-sse-hub", daemon=True)
                self._thread.start()
                _STARTED.add(self)
        if not self._ready.wait(self.config.start_timeout):
            raise psycopg.OperationalError("the SSE event hub cannot read sa_job_event yet")

    def stop(self, timeout: float = 5.0) -> None:
        """Stops reading and closes every subscription (their streams end)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._listener is not None:
            self._listener.stop(timeout)
        self._close_all("shutdown")

    def drain(self) -> None:
        """Closes every subscription, now and from now on; signal-handler safe (sets flags only)."""
        self._draining.set()
        self._wake.set()

    def _close_all(self, reason: str) -> None:
        with self._lock:
            subs = [sub for group in self._subs.values() for sub in group]
            self._subs.clear()
        for sub in subs:
            sub.close(reason)

    def wake(self) -> None:
        """Asks the reader to look now (a notification arrived, or the listener reconnected)."""
        self._wake.set()

    def subscribe(self, org_id: int, user_id: int) -> Subscription:
        """Registers a stream for (org, user); it receives every event delivered after its
        `start_after`, and events up to `start_after` are final, so a replay of
        `(last_event_id, start_after]` followed by the live events has no gap and no duplicate.

        Raises:
            RuntimeError: the hub is not ready (call `ensure_started` first).
        """
        with self._lock:
            if self._after is None:
                raise RuntimeError("the event hub is not started")
            sub = Subscription(org_id, user_id, self._after, self.config.client_buffer)
            if self._draining.is_set():
                sub.close("shutdown")
            else:
                self._subs[sub.key].add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Forgets a stream (idempotent)."""
        with self._lock:
            group = self._subs.get(sub.key)
            if group is not None:
                group.discard(sub)
                if not group:
                    del self._subs[sub.key]
        sub.close("unsubscribed")

    def poll_once(self, full: bool = True) -> bool:
        """Delivers every event that is safe to deliver now.

        Args:
            full: also take a barrier (and notice a restarted sequence) even without a gap.

        Returns:
            True when an event is held back behind a gap (or the hub is not ready yet), so the
            caller should look again soon.
        """
        with self._pool.connection() as conn:
            if full or self._after is None:
                self._take_barrier(conn)
            if self._after is None:
                self.rounds += 1
                return True
            held = self._read_and_deliver(conn)
            if held and not full:
                self._take_barrier(conn)
                held = self._read_and_deliver(conn)
        self.rounds += 1
        return held

    def _take_barrier(self, conn: DictConnection) -> None:
        # NOTE: two statements, in this order (see the class NOTE); the rows are read after both.
        last_row = conn.execute(q.JOB_EVENT_SEQUENCE_LAST).fetchone()
        xid_row = conn.execute(q.JOB_EVENT_WRITERS_IN_FLIGHT).fetchone()
        assert last_row is not None and xid_row is not None
        last_id: int = last_row["last_id"]
        in_flight = frozenset(xid_row["xids"])
        if self._after is not None and last_id < self._after:
            # NOTE: only TRUNCATE ... RESTART IDENTITY (or a restored dump) moves the sequence back;
            # open streams keep their subscriptions and follow the new ids from the start.
            log.warning("sse_hub.sequence_restarted", last_id=last_id, cursor=self._after)
            with self._lock:
                self._after = 0
            self._horizon = 0
            self._barrier = None
        if self._barrier is not None and self._barrier.xids.isdisjoint(in_flight):
            self._horizon = max(self._horizon, self._barrier.last_id)
            self._barrier = None
        if not in_flight:
            self._horizon = max(self._horizon, last_id)
        elif self._barrier is None:
            self._barrier = _Barrier(last_id, in_flight)
        if self._after is None:
            if self._init_target is None:
                self._init_target = last_id
            if self._horizon >= self._init_target:
                with self._lock:
                    self._after = self._init_target
                self._ready.set()
                log.info("sse_hub.ready", cursor=self._init_target)

    def _read_and_deliver(self, conn: DictConnection) -> bool:
        """Delivers final events page by page; True when one is held back behind a gap."""
        while True:
            assert self._after is not None
            expected = self._after
            rows = conn.execute(q.JOB_EVENT_LIST_AFTER,
                                {"after": expected, "limit": self.config.page_size}).fetchall()
            ready: list[JobEvent] = []
            for row in rows:
                if row["id"] != expected + 1 and row["id"] > self._horizon:
                    break
                ready.append(JobEvent.from_row(row))
                expected = row["id"]
            if ready:
                self._deliver(ready)
            if len(ready) < len(rows):
                return True
            if len(rows) < self.config.page_size:
                return False

    def _deliver(self, events: list[JobEvent]) -> None:
        by_key: dict[Key, list[JobEvent]] = defaultdict(list)
        for event in events:
            by_key[(event.org_id, event.created_by)].append(event)
        dropped: list[Subscription] = []
        # NOTE: offering and moving the cursor under one lock makes `subscribe` see either all of
        # this batch (live) or none of it (replayed from the table), never half.
        with self._lock:
            for key, batch in by_key.items():
                group = self._subs.get(key)
                if group is None:
                    continue
                for sub in group:
                    if not sub.offer(batch):
                        dropped.append(sub)
                group.difference_update(dropped)
                if not group:
                    del self._subs[key]
            self._after = events[-1].id
        for sub in dropped:
            log.warning("sse.client_too_slow", org_id=sub.org_id, user_id=sub.user_id,
                        buffer=self.config.client_buffer)
            sub.close("too far behind")

    def _run(self) -> None:
        retry = _RETRY_FIRST
        last_full = float("-inf")
        while not self._stopping.is_set():
            if self._draining.is_set():
                self._close_all("shutdown")
            woken = self._wake.is_set()
            self._wake.clear()
            now = time.monotonic()
            full = not woken or now - last_full >= self.config.poll_interval
            try:
                held = self.poll_once(full=full)
                if full:
                    last_full = now
            except Exception as exc:
                log.warning("sse_hub.read_failed", error=str(exc), error_type=type(exc).__name__)
                held = True
                retry = max(retry, self.config.poll_interval / 4)
            if held:
                delay, retry = retry, min(retry * 2, self.config.poll_interval)
            else:
                delay, retry = self.config.poll_interval, _RETRY_FIRST
            self._wake.wait(delay)


def replay_events(
    pool: ConnectionPool[DictConnection],
    org_id: int,
    user_id: int,
    after: int,
    upto: int,
    page_size: int = 500,
) -> Iterator[list[JobEvent]]:
    """Yields, page by page, the (org, user)'s events with `after < id <= upto`, in id order.

    Each page borrows a pooled connection only while it is read, never while the caller
    writes it to a (possibly slow) client.
    """
    while after < upto:
        with pool.connection() as conn:
            rows = conn.execute(q.JOB_EVENT_LIST_FOR_USER_BETWEEN, {
                "org_id": org_id, "user_id": user_id, "after": after, "upto": upto,
                "limit": page_size}).fetchall()
        if not rows:
            return
        events = [JobEvent.from_row(row) for row in rows]
        yield events
        if len(rows) < page_size:
            return
        after = events[-1].id
