"""Retention: archive old finished jobs and prune expired idempotency keys, as the maintenance leader.

The same work the `archive-old-jobs` and `prune-idempotency-keys` commands do from cron, run on
an interval by the one worker that holds the maintenance role (docs/architecture.md: the leader
runs reclaim and retention), so no system cron is needed. Each part is off when its age is 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, delete_in_pages
from jobqueue.core.queries.batch import BATCH_DELETE_FINISHED_MANY
from jobqueue.core.queries.file import FILE_DELETE_EXPIRED_MANY
from jobqueue.core.queries.spend import ORG_SPEND_DELETE_OLD_MANY
from jobqueue.core.settings import KEY_TTL_SECONDS, Settings
from jobqueue.engine.idempotency import prune_expired_keys
from jobqueue.runtime.archive import ArchiveCursor, Archiver

__all__ = ["Retention", "RetentionCounts"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class RetentionCounts:
    """What one retention round did; `more` when the archive stopped at its batch bound."""

    archived_jobs: int = 0
    pruned_keys: int = 0
    more: bool = False
    removed_files: int = 0
    removed_batches: int = 0
    removed_spend_days: int = 0


class Retention:
    """Runs bounded retention rounds on a pool (tests) or one connection (the leader's own).

    A round that stops at its archive bound leaves a cursor, so the next round goes on from
    there instead of scanning the same rows again; a complete pass starts over.
    """

    @dataclass(frozen=True)
    class Config:
        """Ages in seconds, 0 meaning off.

        Attributes:
            archive_after: finished prompt families unchanged for this long move to the archive
                tables (`SA_ARCHIVE_AFTER`, 30 days).
            idempotency_key_retention: keys older than this are deleted
                (`SA_IDEMPOTENCY_KEY_RETENTION`, 24 h; never less than the keys' 24 h lifetime).
            archive_batch_size: jobs scanned per archive batch (one short transaction each).
            archive_max_batches: archive batches per round at most; the rest waits for the next
                round, which then comes at the next reclaim round rather than a whole interval on.
            statement_timeout: bound on each statement, applied with SET LOCAL.
            batch_retention: finished batches (and their request rows) older than this are
                deleted (`SA_BATCH_RETENTION`, 30 days; 0 keeps them). Files go when they expire
                (`expires_at`), and uploads abandoned for a day with them.
        """

        archive_after: float = 30 * 86400.0
        idempotency_key_retention: float = float(KEY_TTL_SECONDS)
        archive_batch_size: int = 500
        archive_max_batches: int = 20
        statement_timeout: float = 30.0
        batch_retention: float = 30 * 86400.0

        def __post_init__(self) -> None:
            for name in ("archive_after", "idempotency_key_retention", "batch_retention"):
                value = getattr(self, name)
                if not (math.isfinite(value) and value >= 0):
                    raise ValueError(f"{name} must be 0 (off) or a positive number of seconds, "
                                     f"got {value!r}")
            if 0 < self.idempotency_key_retention < KEY_TTL_SECONDS:
                raise ValueError(f"idempotency_key_retention must be 0 or at least "
                                 f"{KEY_TTL_SECONDS}, got {self.idempotency_key_retention!r}")
            for name in ("archive_batch_size", "archive_max_batches"):
                if getattr(self, name) <= 0:
                    raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
            if not (math.isfinite(self.statement_timeout) and self.statement_timeout > 0):
                raise ValueError("statement_timeout must be a positive number of seconds, "
                                 f"got {self.statement_timeout!r}")

        @property
        def enabled(self) -> bool:
            """False when every part is off."""
            return (self.archive_after > 0 or self.idempotency_key_retention > 0
                    or self.batch_retention > 0)

        @classmethod
        def from_settings(cls, settings: Settings) -> Retention.Config:
            """Returns the config that `SA_ARCHIVE_AFTER` and `SA_IDEMPOTENCY_KEY_RETENTION` describe."""
            return cls(archive_after=settings.archive_after,
                       idempotency_key_retention=settings.idempotency_key_retention,
                       batch_retention=settings.batch_retention)

    def __init__(self, config: Retention.Config) -> None:
        self.config = config
        self._resume_after: ArchiveCursor | None = None

    def run_once(
        self, db: ConnectionPool[DictConnection] | DictConnection, now: datetime | None = None
    ) -> RetentionCounts:
        """Archives what is older than `archive_after` and prunes keys older than their retention.

        Args:
            db: a pool, or the one connection to run on.
            now: the instant the archive's age counts from; None for this host's clock. Keys
                age by the database's clock.

        Returns:
            Jobs archived, keys deleted, and whether the archive has more to do.

        Raises:
            psycopg.Error: a statement failed or timed out; work already committed stays.
        """
        cfg = self.config
        archived, more = 0, False
        if cfg.archive_after > 0:
            before = (now or datetime.now(UTC)) - timedelta(seconds=cfg.archive_after)
            archiver = Archiver(db, Archiver.Config(batch_size=cfg.archive_batch_size,
                                                    statement_timeout=cfg.statement_timeout))
            counts = archiver.run_once(before, max_batches=cfg.archive_max_batches,
                                       start_after=self._resume_after)
            self._resume_after = counts.resume_after
            archived, more = counts.jobs, counts.resume_after is not None
        pruned = 0
        if cfg.idempotency_key_retention > 0:
            pruned = prune_expired_keys(db, cfg.idempotency_key_retention,
                                        statement_timeout=cfg.statement_timeout)
        files = delete_in_pages(db, FILE_DELETE_EXPIRED_MANY, {"abandoned": _ABANDONED_UPLOAD},
                                page=_DELETE_PAGE, statement_timeout=cfg.statement_timeout)
        # NOTE: always on: the budgets read this month's days only; older ones are dead weight.
        spend_days = delete_in_pages(db, ORG_SPEND_DELETE_OLD_MANY, {}, page=_DELETE_PAGE,
                                     statement_timeout=cfg.statement_timeout)
        batches = 0
        if cfg.batch_retention > 0:
            batches = delete_in_pages(db, BATCH_DELETE_FINISHED_MANY, {"age": cfg.batch_retention},
                                      page=_DELETE_PAGE, statement_timeout=cfg.statement_timeout)
        if archived or pruned or files or batches or spend_days:
            log.info("retention.finished", archived_jobs=archived, pruned_keys=pruned, more=more,
                     removed_files=files, removed_batches=batches,
                     removed_spend_days=spend_days)
        return RetentionCounts(archived_jobs=archived, pruned_keys=pruned, more=more,
                               removed_files=files, removed_batches=batches,
                               removed_spend_days=spend_days)


_ABANDONED_UPLOAD = 86400.0
"""Seconds after which an upload never completed (its web process died) is removed."""

_DELETE_PAGE = 100
