"""Applies the package's sql/migrations/NNNN_name.sql in order, each in its own transaction, under an
advisory lock, and refuses to go on when a file already applied has changed since; then brings the
database's functions and triggers to today's definitions (sql/functions/)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

import psycopg
import structlog

from jobqueue.core.queries import migration as q
from jobqueue.schema.functions import FUNCTIONS, drift, load_definitions

__all__ = ["MIGRATIONS", "Migration", "MigrationError", "load_migrations", "migrate"]

MIGRATIONS: Traversable = resources.files("jobqueue") / "sql" / "migrations"
"""The migrations shipped inside the package (wheel or checkout alike), not the working directory's."""

# NOTE: the migration that adds the ledger's checksum column; rows applied before it get theirs
# filled in from the shipped files once it is there.
_CHECKSUM_MIGRATION = "0010_migration_checksum"
_NAME = re.compile(r"^\d{4}_[a-z0-9_]+\.sql$")

# NOTE: as the command line's: a release step against a database that should answer at once.
CONNECT_TIMEOUT = 2

log = structlog.get_logger(__name__)


class MigrationError(Exception):
    """Migrating cannot go on safely: no migration shipped, or an applied one has changed."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One shipped migration file."""

    name: str
    sql: str
    checksum: str


def load_migrations(directory: Traversable = MIGRATIONS) -> list[Migration]:
    """Reads every `NNNN_name.sql` in `directory`, in name order, with its SHA-256.

    Raises:
        MigrationError: there is none (an incomplete install would otherwise "succeed" with no schema).
    """
    names = sorted(e.name for e in directory.iterdir() if _NAME.match(e.name)) if directory.is_dir() else []
    if not names:
        raise MigrationError(f"no migration found in {directory}: the installation is incomplete")
    found = []
    for name in names:
        data = (directory / name).read_bytes()
        found.append(Migration(name.removesuffix(".sql"), data.decode(), hashlib.sha256(data).hexdigest()))
    return found


def migrate(conninfo: str, directory: Traversable = MIGRATIONS,
            functions: Traversable = FUNCTIONS) -> list[str]:
    """Applies every migration not yet recorded in `sa_schema_migration`, recording its checksum,
    then every definition of `functions` the database does not hold exactly (one transaction).

    Concurrent runs are safe: the advisory lock serializes them, and the second
    one finds everything applied.

    Args:
        conninfo: libpq URI of the target database.
        directory: folder holding the `NNNN_name.sql` files.
        functions: folder holding today's function and trigger definitions (`NAME.sql`).

    Returns:
        The names applied by this call, in order.

    Raises:
        MigrationError: no migration in `directory`, or an applied file no longer matches its
            recorded checksum (nothing is applied then).
        psycopg.OperationalError: the database cannot be reached within CONNECT_TIMEOUT.
    """
    migrations = load_migrations(directory)
    definitions = load_definitions(functions)
    applied: list[str] = []
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as conn:
        conn.execute(q.MIGRATION_LOCK)
        try:
            done: set[str] = set()
            ledger = conn.execute(q.MIGRATION_LEDGER_EXISTS).fetchone()
            if ledger is not None and ledger[0]:
                done = {row[0] for row in conn.execute(q.MIGRATION_LIST).fetchall()}
            if _CHECKSUM_MIGRATION in done:
                _verify(conn, migrations)
            for migration in migrations:
                if migration.name in done:
                    continue
                with conn.transaction():
                    conn.execute(migration.sql.encode())
                    conn.execute(q.MIGRATION_RECORD, (migration.name,))
                applied.append(migration.name)
                log.info("migration.applied", name=migration.name)
            if _CHECKSUM_MIGRATION in done or _CHECKSUM_MIGRATION in applied:
                for migration in migrations:
                    conn.execute(q.MIGRATION_CHECKSUM_FILL,
                                 {"checksum": migration.checksum, "name": migration.name})
            with conn.transaction():
                for definition in drift(conn, definitions):
                    conn.execute(definition.sql.encode())
                    log.info("migration.function_defined", name=definition.name)
        finally:
            conn.execute(q.MIGRATION_UNLOCK)
    return applied


def _verify(conn: psycopg.Connection[tuple[str, str | None]], migrations: list[Migration]) -> None:
    recorded = dict(conn.execute(q.MIGRATION_CHECKSUM_LIST).fetchall())
    for migration in migrations:
        checksum = recorded.get(migration.name)
        if checksum is not None and checksum != migration.checksum:
            raise MigrationError(
                f"migration {migration.name} changed since it was applied (checksum "
                f"{checksum[:12]} recorded, {migration.checksum[:12]} now); restore the file and "
                "put the change in a new migration")
