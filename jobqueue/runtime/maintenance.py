"""The maintenance leader: one runner, elected by a session advisory lock, runs reclaim, the chain
sweep, the streamed-text sweep and retention.

Every long-running worker starts a `MaintenanceLeader`. Each one competes for a fixed
advisory lock on its own dedicated connection (a session lock belongs to one backend, so a
pooled connection would not do); the one holding it runs `Reclaimer.run_once()` on that
connection every `reclaim_interval`, jittered, then `chains.sweep()` (chains left waiting on a
job that already ended), and `Retention.run_once()` every
`retention_interval` (and at once when it becomes leader). Each round also deletes the streamed
text (sa_job_delta) of attempts that ended without a finalize (`streaming.sweep_ended`). When
the holder dies or its connection breaks, Postgres releases the lock and another worker takes
the role at its next attempt. No system cron is needed, and however many workers run, one acts at a time.

NOTE: the session sets server-side TCP keepalives (and libpq sets client-side ones), so a leader
whose host vanishes from the network loses the lock within about a minute. Until then (a network
partition), two runners may overlap. That is safe: the reclaim statement locks the
rows it changes (SKIP LOCKED) and re-checks `state = 'running'`, so it is idempotent.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

import psycopg
import structlog
from psycopg.rows import dict_row

from jobqueue.core.db import SESSION_SETTINGS, DictConnection
from jobqueue.core.queries import maintenance as q
from jobqueue.core.settings import Settings
from jobqueue.engine import chains
from jobqueue.engine.reclaim import ReclaimCounts, Reclaimer
from jobqueue.runtime.retention import Retention, RetentionCounts
from jobqueue.runtime.streaming import sweep_ended

__all__ = ["MaintenanceLeader"]

log = structlog.get_logger(__name__)

APPLICATION_NAME = "sa-core maintenance"


class MaintenanceLeader:
    """Competes for the maintenance role in a thread and, while it holds it, runs reclaim rounds.

    Hooks for tests and operators: `became_leader` is set while this runner holds the role,
    `terms` counts how often it took it, `lock_attempts` how often it tried, `rounds` counts
    reclaim rounds run, `retention_rounds` retention rounds, `errors` failed steps,
    `keepalives` holds the server's TCP keepalive settings of the current session, and
    `on_round` (if given) is called in the leader's thread with each round's counts.
    """

    @dataclass(frozen=True)
    class Config:
        """Intervals in seconds; every one must be positive and finite.

        Attributes:
            reclaim_interval: pause between reclaim rounds while leader (`SA_RECLAIM_INTERVAL`).
            lock_retry_interval: pause between attempts to take the role while not leader.
            reconnect_delay: pause after the connection failed, before connecting again.
            connect_timeout: bound on opening the dedicated connection.
            retention_interval: pause between retention rounds (`SA_RETENTION_INTERVAL`).
            keepalive_idle: seconds of silence before the first TCP keepalive probe, both ends
                (`SA_LEADER_KEEPALIVE_IDLE`).
            keepalive_interval: seconds between unanswered probes (`SA_LEADER_KEEPALIVE_INTERVAL`).
            keepalive_count: unanswered probes before the connection counts as dead
                (`SA_LEADER_KEEPALIVE_COUNT`); with
                the two above, a vanished peer is noticed after idle + interval * count
                seconds (50 by default), which also bounds unacknowledged writes
                (tcp_user_timeout).
            jitter: each pause varies by up to this fraction either way (0 <= jitter < 1).
        """

        reclaim_interval: float = 60.0
        lock_retry_interval: float = 60.0
        reconnect_delay: float = 5.0
        connect_timeout: float = 10.0
        retention_interval: float = 3600.0
        keepalive_idle: int = 20
        keepalive_interval: int = 10
        keepalive_count: int = 3
        jitter: float = 0.1

        def __post_init__(self) -> None:
            for name in ("reclaim_interval", "lock_retry_interval", "reconnect_delay",
                         "connect_timeout", "retention_interval", "keepalive_idle",
                         "keepalive_interval", "keepalive_count"):
                value = getattr(self, name)
                if not (math.isfinite(value) and value > 0):
                    raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
            if not 0 <= self.jitter < 1:
                raise ValueError(f"jitter must be within [0, 1), got {self.jitter!r}")

    def __init__(
        self,
        conninfo: str,
        reclaim: Reclaimer.Config,
        config: MaintenanceLeader.Config,
        *,
        retention: Retention.Config | None = None,
        on_round: Callable[[ReclaimCounts], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """Prepares a leader; `start()` runs it.

        Args:
            conninfo: libpq URI of a direct connection (not PgBouncer in transaction mode).
            reclaim: what a reclaim round does.
            config: how often it competes and runs.
            retention: what a retention round does; None (or both ages 0) for none.
            on_round: called in the leader's thread after every reclaim round.
            rng: source of jitter.
        """
        self.conninfo = conninfo
        self.reclaim = reclaim
        self.config = config
        self.retention = (Retention(retention) if retention is not None and retention.enabled
                          else None)
        self.on_round = on_round
        self.became_leader = threading.Event()
        self.terms = 0
        self.lock_attempts = 0
        self.rounds = 0
        self.retention_rounds = 0
        self.errors = 0
        self.last_counts: ReclaimCounts | None = None
        self.last_settled: chains.Settled | None = None
        self.last_deltas_swept = 0
        self.last_retention: RetentionCounts | None = None
        self.keepalives: dict[str, str] = {}
        self._retention_due = 0.0
        self._rng = rng or random.Random()
        self._stopping = threading.Event()
        self._conn: DictConnection | None = None
        self._leader = False
        self._thread: threading.Thread | None = None
        self.log = log.bind(component="maintenance")

    @classmethod
    def from_settings(
        cls, settings: Settings, on_round: Callable[[ReclaimCounts], None] | None = None
    ) -> MaintenanceLeader:
        """Returns a leader on `SA_DIRECT_DATABASE_URL` with the durations of `settings`."""
        config = cls.Config(reclaim_interval=settings.reclaim_interval,
                            lock_retry_interval=settings.reclaim_interval,
                            retention_interval=settings.retention_interval,
                            keepalive_idle=settings.leader_keepalive_idle,
                            keepalive_interval=settings.leader_keepalive_interval,
                            keepalive_count=settings.leader_keepalive_count)
        return cls(settings.direct_database_url, Reclaimer.Config.from_settings(settings), config,
                   retention=Retention.Config.from_settings(settings), on_round=on_round)

    @property
    def is_leader(self) -> bool:
        """True while this runner holds the maintenance lock (as far as it knows)."""
        return self._leader

    def start(self) -> MaintenanceLeader:
        """Starts the leader's thread; returns self."""
        if self._thread is not None:
            raise RuntimeError("maintenance leader already started")
        self._thread = threading.Thread(target=self._run, name="sa-maintenance", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stops competing, releases the lock and closes the connection.

        Args:
            timeout: seconds to wait for a round in progress (bounded by its statement timeout).
        """
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self.log.warning("maintenance.stop_timeout", timeout=timeout)

    def __enter__(self) -> MaintenanceLeader:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            self.log.info("maintenance.started")
            while not self._stopping.is_set():
                try:
                    pause = self._step()
                except Exception:
                    # NOTE: `_step` handles its own errors; this only catches a failure of the
                    # handling itself (a broken log stream), which must not end the role's loop.
                    self.errors += 1
                    pause = self.config.reconnect_delay
                self._stopping.wait(self._jittered(pause))
        finally:
            self._close()
            self.log.info("maintenance.stopped")

    def _jittered(self, seconds: float) -> float:
        spread = self.config.jitter
        return seconds * (1.0 + self._rng.uniform(-spread, spread))

    def _step(self) -> float:
        """One pass: connect if needed, compete if not leader, reclaim (and retention) if leader.

        Returns:
            Seconds to pause before the next pass.
        """
        cfg = self.config
        try:
            conn = self._connection()
            if not self._leader and not self._try_lock(conn):
                return cfg.lock_retry_interval
            counts = Reclaimer(conn, self.reclaim).run_once()
            self.last_settled = chains.sweep(conn)
            self.last_deltas_swept = sweep_ended(conn)
            self.last_counts = counts
            self.rounds += 1
            if self.on_round is not None:
                self.on_round(counts)
            self._run_retention_if_due(conn)
            return cfg.reclaim_interval
        except psycopg.Error as exc:
            self.errors += 1
            if self._conn is None or self._conn.closed or self._conn.broken:
                self.log.warning("maintenance.connection_lost", error=str(exc).strip(),
                                 was_leader=self._leader)
                self._close()
                return cfg.reconnect_delay
            self.log.warning("maintenance.round_failed", error=str(exc).strip(),
                             error_type=type(exc).__name__)
        except Exception:
            self.errors += 1
            self.log.exception("maintenance.round_failed")
        return cfg.reclaim_interval if self._leader else cfg.lock_retry_interval

    def _run_retention_if_due(self, conn: DictConnection) -> None:
        if self.retention is None or time.monotonic() < self._retention_due:
            return
        # NOTE: due again before it runs, so a failing round waits its interval like a good one.
        self._retention_due = time.monotonic() + self._jittered(self.config.retention_interval)
        counts = self.retention.run_once(conn)
        if counts.more:
            self._retention_due = 0.0
        self.last_retention = counts
        self.retention_rounds += 1

    def _connection(self) -> DictConnection:
        if self._conn is None or self._conn.closed:
            cfg = self.config
            dead_after = cfg.keepalive_idle + cfg.keepalive_interval * cfg.keepalive_count
            # NOTE: client-side keepalives let a half-open connection fail within about a
            # minute, so a partitioned leader notices; the server-side ones set below let
            # Postgres end the backend (and release the lock) on the same timers.
            conn = psycopg.connect(
                self.conninfo, autocommit=True, row_factory=dict_row,
                connect_timeout=max(2, math.ceil(cfg.connect_timeout)),
                application_name=APPLICATION_NAME,
                keepalives=1, keepalives_idle=cfg.keepalive_idle,
                keepalives_interval=cfg.keepalive_interval,
                keepalives_count=cfg.keepalive_count, tcp_user_timeout=dead_after * 1000,
            )
            try:
                row = conn.execute(q.MAINTENANCE_SET_KEEPALIVES, {
                    "idle": str(cfg.keepalive_idle), "interval": str(cfg.keepalive_interval),
                    "count": str(cfg.keepalive_count), "user_timeout_ms": str(dead_after * 1000),
                }).fetchone()
                conn.execute(SESSION_SETTINGS)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
            self.keepalives = dict(row or {})
            self.log.info("maintenance.connected", **self.keepalives)
        return self._conn

    def _try_lock(self, conn: DictConnection) -> bool:
        row = conn.execute(q.MAINTENANCE_TRY_LOCK).fetchone()
        self.lock_attempts += 1
        if row is None or not row["locked"]:
            return False
        self._leader = True
        self.terms += 1
        self.became_leader.set()
        self.log.info("maintenance.leader_acquired", term=self.terms)
        return True

    def _close(self) -> None:
        """Drops leadership and the connection; releases the lock first when it can."""
        conn, self._conn = self._conn, None
        was_leader, self._leader = self._leader, False
        self.became_leader.clear()
        if conn is None:
            return
        try:
            if was_leader and not conn.closed and not conn.broken:
                conn.execute(q.MAINTENANCE_UNLOCK)
                self.log.info("maintenance.leader_released", term=self.terms)
        except psycopg.Error as exc:
            self.log.warning("maintenance.unlock_failed", error=str(exc).strip())
        finally:
            conn.close()
