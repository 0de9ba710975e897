"""Applies sql/migrations/NNNN_name.sql in order, each in its own transaction, under an advisory lock."""

from __future__ import annotations

from pathlib import Path

import psycopg
import structlog

from jobqueue.core.queries import migration as q

__all__ = ["MIGRATIONS_DIR", "migrate"]

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "sql" / "migrations"

log = structlog.get_logger(__name__)


def migrate(conninfo: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Applies every migration not yet recorded in `sa_schema_migration`.

    Concurrent runs are safe: the advisory lock serializes them, and the second
    one finds everything applied.

    Args:
        conninfo: libpq URI of the target database.
        directory: folder holding the `NNNN_name.sql` files.

    Returns:
        The names applied by this call, in order.
    """
    files = sorted(directory.glob("[0-9][0-9][0-9][0-9]_*.sql"))
    applied: list[str] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(q.MIGRATION_LOCK)
        try:
            done: set[str] = set()
            ledger = conn.execute(q.MIGRATION_LEDGER_EXISTS).fetchone()
            if ledger is not None and ledger[0]:
                done = {row[0] for row in conn.execute(q.MIGRATION_LIST).fetchall()}
            for path in files:
                if path.stem in done:
                    continue
                with conn.transaction():
                    conn.execute(path.read_text())
                    conn.execute(q.MIGRATION_RECORD, (path.stem,))
                applied.append(path.stem)
                log.info("migration.applied", name=path.stem)
        finally:
            conn.execute(q.MIGRATION_UNLOCK)
    return applied
