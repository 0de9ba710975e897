"""The per-process event hub behind SSE: one reader of sa_job_event, fanned out in memory per caller."""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.listener import NotificationListener
from jobqueue.core.queries import job_event as q
from jobqueue.core.queries import partial as partial_q
from jobqueue.core.queries import token as token_q
from jobqueue.core.settings import Settings
from jobqueue.core.states import TERMINAL
from service.event_horizon import EventHorizon, Observed

__all__ = [
    "EventHub",
    "HubConfig",
    "JobEvent",
    "Live",
    "OutputDelta",
    "StreamLimitExceeded",
    "Subscription",
    "SubscriptionClosed",
    "close_all_streams",
    "replay_events",
]

log = structlog.get_logger(__name__)

Key = tuple[int, int | None]
"""Whose events a subscription receives: (org, user), or (org, None) for the whole org."""

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
    response_text: str | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> JobEvent:
        """Builds an event from a row of JOB_EVENT_LIST_* (a dict row)."""
        return cls(**row)

    def payload(self) -> dict[str, Any]:
        """Returns what a client may see: everything but the org, which is the client's own.

        `created_by` names the job's creator, which tells an org-wide stream (`scope=org`) whose
        job moved.
        """
        return {
            "id": self.id,
            "job_id": self.job_id,
            "prompt_id": self.prompt_id,
            "created_by": self.created_by,
            "from_state": self.from_state,
            "to_state": self.to_state,
            "attempt": self.attempt,
            "error_kind": self.error_kind,
            "response_id": self.response_id,
            "at": self.at,
            "response_text": self.response_text,
        }


@dataclass(frozen=True, slots=True)
class OutputDelta:
    """Text a streamed attempt appended since the previous delta; no event id (not in the log).

    `offset` is the length of the attempt's text before this piece: 0 starts an attempt (a
    retry's stream starts over), and a client that read `partial_text` from GET /jobs applies
    only what lies past what it has.
    """

    job_id: uuid.UUID
    prompt_id: uuid.UUID
    org_id: int
    created_by: int
    attempt: int
    offset: int
    text: str

    def payload(self) -> dict[str, Any]:
        """Returns what a client may see (not the org, its own)."""
        return {"job_id": self.job_id, "prompt_id": self.prompt_id, "attempt": self.attempt,
                "offset": self.offset, "text": self.text}


Live = JobEvent | OutputDelta
"""What a subscription carries: transitions (with ids, in id order) and output deltas."""


class SubscriptionClosed(Exception):
    """The hub dropped a subscription: it fell too far behind, its token stopped acting, or the
    hub stopped."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StreamLimitExceeded(Exception):
    """A new stream would pass the per-token or the per-process cap; the client retries later."""

    def __init__(self, description: str, retry_after: int) -> None:
        super().__init__(description)
        self.description = description
        self.retry_after = retry_after


class Subscription:
    """One client's bounded buffer of live events; the hub fills it, the client's stream drains it.

    Every event the hub delivers after `start_after` for its key arrives here, in id order.
    `start_after` is None until the hub knows its cursor (`wait_start`). A client too slow to
    keep `capacity` events or fewer waiting is closed instead of slowing the hub (or anyone
    else); it resumes with Last-Event-ID.
    """

    def __init__(self, org_id: int, user_id: int | None, token: bytes, capacity: int) -> None:
        self.org_id = org_id
        self.user_id = user_id
        self.token = token
        self.start_after: int | None = None
        self._capacity = capacity
        self._buffer: deque[Live] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._closed: str | None = None

    @property
    def key(self) -> Key:
        """The (org, user), or (org, None) for an org-wide stream, whose events it receives."""
        return (self.org_id, self.user_id)

    def start(self, after: int) -> None:
        """Sets the point from which live events arrive (the hub's cursor when it learned it)."""
        with self._cond:
            self.start_after = after
            self._cond.notify_all()

    def wait_start(self, timeout: float) -> int | None:
        """Returns `start_after`, waiting up to `timeout` for the hub to know it.

        Raises:
            SubscriptionClosed: the hub dropped this subscription.
        """
        with self._cond:
            if self.start_after is None and self._closed is None:
                self._cond.wait(timeout)
            if self._closed is not None:
                raise SubscriptionClosed(self._closed)
            return self.start_after

    def wait(self, timeout: float) -> list[Live]:
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

    def offer(self, events: Sequence[Live]) -> bool:
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
    """How often the hub reads and checks tokens, how much it buffers, how many streams it takes."""

    poll_interval: float = 2.0
    page_size: int = 500
    client_buffer: int = 1000
    start_timeout: float = 10.0
    max_streams: int = 500
    max_streams_per_token: int = 10
    token_check: float = 5.0

    def __post_init__(self) -> None:
        if self.poll_interval <= 0 or self.start_timeout <= 0 or self.token_check <= 0:
            raise ValueError("poll_interval, start_timeout and token_check must be positive")
        if min(self.page_size, self.client_buffer, self.max_streams,
               self.max_streams_per_token) < 1:
            raise ValueError("page_size, client_buffer and the stream caps must be at least 1")


class EventHub:
    """Reads sa_job_event once for the whole process and hands each event to its owner's streams.

    It reads when its LISTEN connection reports a notification (the payload is only a wake-up
    call; content always comes from the table), and every `poll_interval` regardless, which is
    all it does when `listen_conninfo` is None (SA_LISTEN=0, e.g. behind PgBouncer in
    transaction mode). Reads borrow the pool for a moment; clients never hold a connection.
    Every `token_check` it also ends the streams whose token was revoked or expired.

    NOTE: gap-free delivery. The hub delivers in strict id order and never passes an id that
    may still appear; which ids are final is decided by `EventHorizon` (service/event_horizon.py)
    from barriers this hub reads. Its cursor is thus always a point below which nothing new can
    appear, which makes Last-Event-ID replay up to it exact (see `subscribe`) and lets
    /mission/recent page the log up to it. Ordinary traffic never waits for a barrier (ids
    arrive contiguously); only a gap does, for as long as the transactions that then held a
    lock on sa_job_event take to end. Other transactions, whatever they hold, never matter.
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
        self._per_token: dict[bytes, int] = defaultdict(int)
        self._job_watchers: dict[uuid.UUID, set[threading.Event]] = defaultdict(set)
        self._taps: list[Callable[[Sequence[Live]], None]] = []
        self._horizon = EventHorizon()
        self._ready = threading.Event()
        self._looked = threading.Event()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._draining = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: NotificationListener | None = None
        # NOTE: streamed attempts: sa_job_partial read after this seq; each job's (attempt, length)
        # sent so far, forgotten when its attempt ends.
        self._partial_after: int | None = None
        self._partial_sent: dict[uuid.UUID, tuple[int, int]] = {}
        # NOTE: reads completed; tests wait on it (like Worker.claim_rounds).
        self.rounds = 0

    @classmethod
    def from_settings(cls, pool: ConnectionPool[DictConnection], settings: Settings) -> EventHub:
        """Builds a hub that LISTENs on the direct database URL unless SA_LISTEN=0."""
        config = HubConfig(poll_interval=settings.poll_interval,
                           max_streams=settings.sse_max_streams,
                           max_streams_per_token=settings.sse_max_streams_per_token,
                           token_check=settings.sse_token_check)
        return cls(pool, config, settings.direct_database_url if settings.listen else None)

    @property
    def cursor(self) -> int | None:
        """The id delivered last (every lower id is final); None until the hub is ready."""
        with self._lock:
            return self._horizon.cursor

    @property
    def subscriber_count(self) -> int:
        """Open subscriptions."""
        with self._lock:
            return sum(len(subs) for subs in self._subs.values())

    def ensure_started(self) -> None:
        """Starts the listener and the reader on first use, and waits for the reader's first look.

        That look reads the sequence, so an event written after this returns is delivered
        live to a stream subscribed now, even before the hub is ready: streams subscribed
        before it get their start point when it is (`Subscription.wait_start`). Nothing open
        elsewhere in the database delays the look.

        Raises:
            psycopg.OperationalError: the hub could not read the database within start_timeout.
        """
        self._start()
        if not self._looked.wait(self.config.start_timeout):
            raise psycopg.OperationalError("the SSE event hub cannot read sa_job_event yet")

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is not None:
                return
            if self._listen_conninfo is not None:
                self._listener = NotificationListener(
                    self._listen_conninfo, q.JOB_EVENT_LISTEN, lambda _payload: self.wake(),
                    self.wake).start()
                # NOTE: listening before the first read, so a commit right after it wakes us.
                self._listener.listening.wait(self.config.start_timeout)
            self._thread = threading.Thread(target=self._run, name="sa-sse-hub", daemon=True)
            self._thread.start()
            _STARTED.add(self)

    def wait_ready(self, timeout: float) -> int | None:
        """Starts the hub if needed and returns its cursor, or None when not ready within `timeout`.

        Raises:
            psycopg.OperationalError: the hub could not read the database within start_timeout.
        """
        self.ensure_started()
        self._ready.wait(timeout)
        return self.cursor

    def stop(self, timeout: float = 5.0) -> None:
        """Stops reading and closes every subscription (their streams end)."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._listener is not None:
            self._listener.stop(timeout)
        self._close_where(lambda _sub: True, "shutdown")

    def drain(self) -> None:
        """Closes every subscription, now and from now on; signal-handler safe (sets flags only)."""
        self._draining.set()
        self._wake.set()

    def wake(self) -> None:
        """Asks the reader to look now (a notification arrived, or the listener reconnected)."""
        self._wake.set()

    def subscribe(self, org_id: int, user_id: int | None, token: bytes) -> Subscription:
        """Registers a stream for (org, user), or the whole org when `user_id` is None.

        It receives every event delivered after its `start_after`, and events up to
        `start_after` are final, so a replay of `(last_event_id, start_after]` followed by the
        live events has no gap and no duplicate.

        Args:
            org_id: the caller's org.
            user_id: the caller, or None for an org-wide stream.
            token: the digest of the token the stream was opened with; the stream ends soon
                after that token stops acting (revoked, expired).

        Raises:
            StreamLimitExceeded: the token, or this process, already has its cap of streams.
        """
        sub = Subscription(org_id, user_id, token, self.config.client_buffer)
        retry_after = max(1, round(self.config.poll_interval))
        with self._lock:
            if sum(len(subs) for subs in self._subs.values()) >= self.config.max_streams:
                raise StreamLimitExceeded(
                    f"this process already serves {self.config.max_streams} event streams "
                    "(SA_SSE_MAX_STREAMS)", retry_after)
            if self._per_token[token] >= self.config.max_streams_per_token:
                raise StreamLimitExceeded(
                    f"this token already has {self.config.max_streams_per_token} open event "
                    "streams here (SA_SSE_MAX_STREAMS_PER_TOKEN); close one first", retry_after)
            if self._draining.is_set():
                sub.close("shutdown")
                return sub
            if self._horizon.cursor is not None:
                sub.start(self._horizon.cursor)
            self._subs[sub.key].add(sub)
            self._per_token[token] += 1
        return sub

    @property
    def watched_jobs(self) -> int:
        """Jobs some request is waiting on (`Prefer: wait=N`)."""
        with self._lock:
            return len(self._job_watchers)

    def watch_job(self, job_id: uuid.UUID) -> threading.Event:
        """Returns an event set when the hub delivers the job's move to a terminal state.

        For `Prefer: wait=N`: the waiting request holds this event, not a pool connection. The
        caller reads the job once after watching (it may have finished before), and always
        calls `unwatch_job`.

        NOTE: returns once the hub is ready, so the caller's read sees every transition up to
        the hub's cursor and the hub delivers every later one: a job that ended while the hub
        was starting is not missed.
        """
        finished = threading.Event()
        with self._lock:
            self._job_watchers[job_id].add(finished)
        try:
            self.wait_ready(self.config.start_timeout)
        except BaseException:
            self.unwatch_job(job_id, finished)
            raise
        return finished

    def unwatch_job(self, job_id: uuid.UUID, finished: threading.Event) -> None:
        """Forgets a watch (idempotent)."""
        with self._lock:
            watchers = self._job_watchers.get(job_id)
            if watchers is not None:
                watchers.discard(finished)
                if not watchers:
                    del self._job_watchers[job_id]

    def add_tap(self, tap: Callable[[Sequence[Live]], None]) -> None:
        """Also hands every delivered batch of events, and of output deltas, to `tap` (in the
        reader's thread, so it must not block): how the chat front door follows single jobs
        (service/openai/follow.py)."""
        self._taps.append(tap)

    def unsubscribe(self, sub: Subscription) -> None:
        """Forgets a stream (idempotent)."""
        with self._lock:
            self._forget(sub)
        sub.close("unsubscribed")

    def _forget(self, sub: Subscription) -> None:
        """Drops a subscription from the registry; the caller holds `_lock`."""
        group = self._subs.get(sub.key)
        if group is None or sub not in group:
            return
        group.discard(sub)
        if not group:
            del self._subs[sub.key]
        self._per_token[sub.token] -= 1
        if not self._per_token[sub.token]:
            del self._per_token[sub.token]

    def _close_where(self, doomed: Callable[[Subscription], bool], reason: str) -> None:
        with self._lock:
            subs = [sub for group in self._subs.values() for sub in group if doomed(sub)]
            for sub in subs:
                self._forget(sub)
        for sub in subs:
            sub.close(reason)

    def poll_once(self, full: bool = True) -> bool:
        """Delivers every event that is safe to deliver now.

        Args:
            full: also take a barrier (and notice a restarted sequence) even without a gap.

        Returns:
            True when an event is held back behind a gap (or the hub is not ready yet), so the
            caller should look again soon.
        """
        with self._pool.connection() as conn:
            if full or self.cursor is None:
                self._take_barrier(conn)
            if self.cursor is None:
                self.rounds += 1
                return True
            held = self._read_and_deliver(conn)
            if held and not full:
                self._take_barrier(conn)
                held = self._read_and_deliver(conn)
            self._read_partials(conn)
        self.rounds += 1
        return held

    def check_tokens(self) -> int:
        """Ends the streams whose token no longer acts (revoked or expired); returns how many."""
        with self._lock:
            tokens = list(self._per_token)
        if not tokens:
            return 0
        with self._pool.connection() as conn:
            rows = conn.execute(token_q.TOKEN_LIST_ACTIVE_MANY,
                                {"token_hashes": tokens}).fetchall()
        active = {bytes(row["token_hash"]) for row in rows}
        ended = [token for token in tokens if token not in active]
        if ended:
            before = self.subscriber_count
            self._close_where(lambda sub: sub.token not in active, "token revoked or expired")
            log.info("sse.streams_ended_for_token", tokens=len(ended),
                     streams=before - self.subscriber_count)
        return len(ended)

    def _read_partials(self, conn: DictConnection) -> None:
        """Turns the growth of streamed attempts' text since the last look into output deltas.

        NOTE: best effort and live only, like the wake-ups: a delta is what a row holds past what
        was sent, so a rewrite read late or twice repeats nothing and loses nothing.
        """
        if self._partial_after is None:
            row = conn.execute(partial_q.JOB_PARTIAL_SEQ_LAST).fetchone()
            assert row is not None
            self._partial_after = int(row["last_seq"])
            return
        rows = conn.execute(partial_q.JOB_PARTIAL_LIST_CHANGED,
                            {"after": self._partial_after}).fetchall()
        if not rows:
            return
        self._partial_after = int(rows[-1]["seq"])
        deltas: dict[Key, list[OutputDelta]] = defaultdict(list)
        for r in rows:
            attempt, sent = self._partial_sent.get(r["job_id"], (r["attempt"], 0))
            offset = sent if attempt == r["attempt"] and sent <= len(r["text"]) else 0
            if offset == len(r["text"]):
                continue
            self._partial_sent[r["job_id"]] = (r["attempt"], len(r["text"]))
            delta = OutputDelta(r["job_id"], r["prompt_id"], r["org_id"], r["created_by"],
                                r["attempt"], offset, r["text"][offset:])
            deltas[(r["org_id"], r["created_by"])].append(delta)
            deltas[(r["org_id"], None)].append(delta)
        self._offer(deltas)
        for tap in self._taps:
            tap([d for (_org, user), group in deltas.items() if user is None for d in group])

    def _take_barrier(self, conn: DictConnection) -> None:
        # NOTE: two statements, in this order (see service/event_horizon.py).
        last_row = conn.execute(q.JOB_EVENT_SEQUENCE_LAST).fetchone()
        holders_row = conn.execute(q.JOB_EVENT_WRITERS_HOLDING).fetchone()
        assert last_row is not None and holders_row is not None
        with self._lock:
            cursor = self._horizon.cursor
            observed = self._horizon.observe(last_row["last_id"], frozenset(holders_row["holders"]),
                                             holders_row["prepared"])
            if observed is Observed.READY:
                for group in self._subs.values():
                    for sub in group:
                        sub.start(self._horizon.cursor or 0)
        self._looked.set()
        if observed is Observed.RESTARTED:
            # NOTE: only TRUNCATE ... RESTART IDENTITY (or a restored dump) moves the sequence back;
            # open streams keep their subscriptions and follow the new ids from the start.
            log.warning("sse_hub.sequence_restarted", last_id=last_row["last_id"], cursor=cursor)
        elif observed is Observed.READY:
            self._ready.set()
            log.info("sse_hub.ready", cursor=self.cursor)

    def _read_and_deliver(self, conn: DictConnection) -> bool:
        """Delivers final events page by page; True when one is held back behind a gap."""
        while True:
            after = self.cursor
            assert after is not None
            rows = conn.execute(q.JOB_EVENT_LIST_AFTER,
                                {"after": after, "limit": self.config.page_size}).fetchall()
            with self._lock:
                count = self._horizon.deliverable([row["id"] for row in rows])
            if count:
                self._deliver([JobEvent.from_row(row) for row in rows[:count]])
            if count < len(rows):
                return True
            if len(rows) < self.config.page_size:
                return False

    def _deliver(self, events: list[JobEvent]) -> None:
        by_key: dict[Key, list[JobEvent]] = defaultdict(list)
        for event in events:
            by_key[(event.org_id, event.created_by)].append(event)
            by_key[(event.org_id, None)].append(event)
            if event.from_state == "running":
                self._partial_sent.pop(event.job_id, None)
        self._offer(by_key, events[-1].id)
        for tap in self._taps:
            tap(events)
        self._wake_watchers(events)

    def _wake_watchers(self, events: list[JobEvent]) -> None:
        """Sets the watch of every job that `events` move to a terminal state."""
        with self._lock:
            if not self._job_watchers:
                return
            for event in events:
                if event.to_state in TERMINAL:
                    for finished in self._job_watchers.get(event.job_id, ()):
                        finished.set()

    def _offer(self, by_key: dict[Key, list[JobEvent]] | dict[Key, list[OutputDelta]],
               cursor: int | None = None) -> None:
        """Hands each key's batch to its streams, dropping the ones too far behind."""
        dropped: list[Subscription] = []
        # NOTE: offering and moving the cursor under one lock makes `subscribe` see either all of
        # this batch (live) or none of it (replayed from the table), never half.
        with self._lock:
            for key, batch in by_key.items():
                for sub in self._subs.get(key, ()):
                    if not sub.offer(batch):
                        dropped.append(sub)
            for sub in dropped:
                self._forget(sub)
            if cursor is not None:
                self._horizon.advance(cursor)
        for sub in dropped:
            log.warning("sse.client_too_slow", org_id=sub.org_id, user_id=sub.user_id,
                        buffer=self.config.client_buffer)
            sub.close("too far behind")

    def _run(self) -> None:
        retry = _RETRY_FIRST
        last_full = last_token_check = float("-inf")
        while not self._stopping.is_set():
            if self._draining.is_set():
                self._close_where(lambda _sub: True, "shutdown")
            woken = self._wake.is_set()
            self._wake.clear()
            now = time.monotonic()
            full = not woken or now - last_full >= self.config.poll_interval
            try:
                held = self.poll_once(full=full)
                if full:
                    last_full = now
                if now - last_token_check >= self.config.token_check:
                    last_token_check = now
                    self.check_tokens()
            except Exception as exc:
                log.warning("sse_hub.read_failed", error=str(exc), error_type=type(exc).__name__)
                held = True
                retry = max(retry, self.config.poll_interval / 4)
            if held:
                delay, retry = retry, min(retry * 2, self.config.poll_interval)
            else:
                delay, retry = min(self.config.poll_interval, self.config.token_check), _RETRY_FIRST
            self._wake.wait(delay)


def replay_events(
    pool: ConnectionPool[DictConnection],
    org_id: int,
    user_id: int | None,
    after: int,
    upto: int,
    page_size: int = 500,
) -> Iterator[list[JobEvent]]:
    """Yields, page by page, the (org, user)'s events with `after < id <= upto`, in id order.

    `user_id` None means the whole org's. Each page borrows a pooled connection only while it
    is read, never while the caller writes it to a (possibly slow) client.
    """
    query = q.JOB_EVENT_LIST_FOR_ORG_BETWEEN if user_id is None else q.JOB_EVENT_LIST_FOR_USER_BETWEEN
    while after < upto:
        with pool.connection() as conn:
            rows = conn.execute(query, {
                "org_id": org_id, "user_id": user_id, "after": after, "upto": upto,
                "limit": page_size}).fetchall()
        if not rows:
            return
        events = [JobEvent.from_row(row) for row in rows]
        yield events
        if len(rows) < page_size:
            return
        after = events[-1].id
