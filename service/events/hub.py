"""The per-process event hub: reads the log once for the whole process and feeds its streams."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import psycopg
import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.horizon import Observed
from jobqueue.core.listener import NotificationListener
from jobqueue.core.queries import job_event as q
from jobqueue.core.settings import Settings
from service.events.deltas import DeltaReader
from service.events.fanout import Fanout
from service.events.log import EventLog
from service.events.model import Live
from service.events.subscription import Subscription
from service.events.tokens import inactive_tokens
from service.events.watchers import JobWatchers

__all__ = ["EventHub", "HubConfig", "close_all_streams"]

log = structlog.get_logger(__name__)

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


@dataclass(frozen=True)
class HubConfig:
    """How often the hub reads and checks tokens, how much it buffers, how many streams it takes.

    `text_chars` is the most of a response's (or a delta's) text an event carries
    (SA_FEED_TEXT_MAX_CHARS); `client_buffer` and `client_buffer_bytes` how much one stream may
    leave unread before it is dropped.
    """

    poll_interval: float = 2.0
    page_size: int = 500
    client_buffer: int = 1000
    client_buffer_bytes: int = 4 * 1024 * 1024
    text_chars: int = 16_384
    start_timeout: float = 10.0
    max_streams: int = 500
    max_streams_per_token: int = 10
    token_check: float = 5.0

    def __post_init__(self) -> None:
        if self.poll_interval <= 0 or self.start_timeout <= 0 or self.token_check <= 0:
            raise ValueError("poll_interval, start_timeout and token_check must be positive")
        if min(self.page_size, self.client_buffer, self.client_buffer_bytes, self.text_chars,
               self.max_streams, self.max_streams_per_token) < 1:
            raise ValueError("page_size, the buffers, text_chars and the stream caps must be "
                             "at least 1")


class EventHub:
    """Reads sa_job_event once for the whole process and hands each event to its owner's streams.

    It reads when its LISTEN connection reports a notification (the payload is only a wake-up
    call; content always comes from the table), and every `poll_interval` regardless, which is
    all it does when `listen_conninfo` is None (SA_LISTEN=0, e.g. behind PgBouncer in
    transaction mode). Reads borrow the pool for a moment; clients never hold a connection.
    Every `token_check` it also ends the streams whose token was revoked or expired.

    Each round, in order: the log's final events (`EventLog`), handed to the streams
    (`Fanout`) and to the waiting requests (`JobWatchers`), then the output deltas
    (`DeltaReader`).
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
        self._log = EventLog(config.page_size, config.text_chars)
        self._fanout = Fanout(config.client_buffer, config.client_buffer_bytes,
                              config.max_streams, config.max_streams_per_token,
                              max(1, round(config.poll_interval)))
        self._watchers = JobWatchers()
        self._deltas = DeltaReader(config.text_chars)
        self._taps: list[Callable[[Sequence[Live]], None]] = []
        self._start_lock = threading.Lock()
        self._ready = threading.Event()
        self._looked = threading.Event()
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
        config = HubConfig(poll_interval=settings.poll_interval,
                           max_streams=settings.sse_max_streams,
                           max_streams_per_token=settings.sse_max_streams_per_token,
                           token_check=settings.sse_token_check,
                           text_chars=settings.feed_text_max_chars)
        return cls(pool, config, settings.direct_database_url if settings.listen else None)

    @property
    def cursor(self) -> int | None:
        """The id delivered last (every lower id is final); None until the hub is ready."""
        return self._fanout.cursor

    @property
    def subscriber_count(self) -> int:
        """Open subscriptions."""
        return self._fanout.count

    @property
    def watched_jobs(self) -> int:
        """Jobs some request is waiting on (`Prefer: wait=N`)."""
        return self._watchers.count

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
        self._fanout.close_all("shutdown")

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
        live events has no gap and no duplicate. The stream ends it with `Subscription.leave`.

        Args:
            org_id: the caller's org.
            user_id: the caller, or None for an org-wide stream.
            token: the digest of the token the stream was opened with; the stream ends soon
                after that token stops acting (revoked, expired).

        Raises:
            StreamLimitExceeded: the token, or this process, already has its cap of streams.
        """
        if self._draining.is_set():
            self._fanout.close_all("shutdown")
        return self._fanout.subscribe(org_id, user_id, token)

    @contextlib.contextmanager
    def watching(self, job_id: uuid.UUID) -> Iterator[threading.Event]:
        """Yields an event set when the hub delivers the job's move to a terminal state.

        For `Prefer: wait=N`: the waiting request holds this event, not a pool connection. The
        caller reads the job once inside (it may have finished before the watch began).

        NOTE: yields once the hub is ready, so the caller's read sees every transition up to
        the hub's cursor and the hub delivers every later one: a job that ended while the hub
        was starting is not missed.

        Raises:
            psycopg.OperationalError: the hub could not read the database within start_timeout.
        """
        finished = self._watchers.watch(job_id)
        try:
            self.wait_ready(self.config.start_timeout)
            yield finished
        finally:
            self._watchers.unwatch(job_id, finished)

    def add_tap(self, tap: Callable[[Sequence[Live]], None]) -> None:
        """Also hands every delivered page of events, and of output deltas, to `tap` (in the
        reader's thread, so it must not block): how the chat front door follows single jobs
        (service/openai/follow.py)."""
        self._taps.append(tap)

    def _tap(self, items: Sequence[Live]) -> None:
        if items:
            for tap in self._taps:
                tap(items)

    def poll_once(self, full: bool = True) -> bool:
        """Delivers every event that is safe to deliver now.

        Args:
            full: also take a barrier (and notice a restarted sequence) even without a gap.

        Returns:
            True when an event is held back behind a gap (or the hub is not ready yet), so the
            caller should look again soon.
        """
        with self._pool.connection() as conn:
            if full or self._log.cursor is None:
                self._look(conn)
            if self._log.cursor is None:
                self.rounds += 1
                return True
            held = self._deliver(conn)
            if held and not full:
                self._look(conn)
                held = self._deliver(conn)
            deltas = self._deltas.read(conn)
            self._fanout.deliver_deltas(deltas)
            self._tap(deltas)
        self.rounds += 1
        return held

    def check_tokens(self) -> int:
        """Ends the streams whose token no longer acts (revoked or expired); returns how many."""
        tokens = self._fanout.tokens()
        if not tokens:
            return 0
        with self._pool.connection() as conn:
            ended = inactive_tokens(conn, tokens)
        if ended:
            streams = self._fanout.close_where(lambda sub: sub.token in ended,
                                               "token revoked or expired")
            log.info("sse.streams_ended_for_token", tokens=len(ended), streams=streams)
        return len(ended)

    def _look(self, conn: DictConnection) -> None:
        observed, last_id = self._log.look(conn)
        self._looked.set()
        if observed is Observed.READY:
            assert self._log.cursor is not None
            self._fanout.start(self._log.cursor)
            self._ready.set()
            log.info("sse_hub.ready", cursor=self._log.cursor)
        elif observed is Observed.RESTARTED:
            # NOTE: only TRUNCATE ... RESTART IDENTITY (or a restored dump) moves the sequence back;
            # open streams keep their subscriptions and follow the new ids from the start.
            self._fanout.restart()
            log.warning("sse_hub.sequence_restarted", last_id=last_id)

    def _deliver(self, conn: DictConnection) -> bool:
        """Delivers final events page by page; True when one is held back behind a gap."""
        while True:
            page = self._log.next_page(conn)
            if page.events:
                self._deltas.forget_ended(page.events)
                self._fanout.deliver(page.events)
                self._tap(page.events)
                self._watchers.notify(page.events)
            if not page.more:
                return page.held

    def _run(self) -> None:
        retry = _RETRY_FIRST
        last_full = last_token_check = float("-inf")
        while not self._stopping.is_set():
            if self._draining.is_set():
                self._fanout.close_all("shutdown")
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
