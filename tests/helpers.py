"""Small helpers shared by the integration tests."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import falcon.testing
import httpx
import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.runtime.batch_keeper import BatchKeeper
from service.app import create_app
from service.event_hub import EventHub


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


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s")


def plan_tree(conn: psycopg.Connection[Any], statement: Any, params: Any = None, *,
              generic: bool = False) -> dict[str, Any]:
    """EXPLAINs `statement` and returns the root node of its plan.

    With `generic`, the plan Postgres caches for a prepared statement (the one a long-lived
    session reuses) instead of one planned for these values: the statement is PREPAREd with $n
    placeholders and EXPLAIN EXECUTEd under plan_cache_mode = force_generic_plan. Runs in the
    caller's transaction.
    """
    if not generic:
        row = conn.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchone()
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
            row = conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE sa_plan_probe{}").format(
                call)).fetchone()
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
    thread = threading.Thread(target=server.serve_forever, daemon=True)
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def gunicorn_web(database_url: str, log_dir: Path, **env: str) -> Iterator[str]:
    """Runs the web as the Procfile does (gunicorn, one gevent worker); yields its base URL."""
    port = _free_port()
    with (log_dir / f"gunicorn-{port}.log").open("wb") as log:
        web = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "python:service.gunicorn_conf",
             "service.app:create_app()"], cwd=Path(__file__).resolve().parent.parent,
            stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "DATABASE_URL": database_url, "PORT": str(port),
                 "WEB_CONCURRENCY": "1", "SA_POLL_INTERVAL": "0.1", **env})
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while not (web.poll() is None and answers(f"{base}/readyz")):
                if time.monotonic() > deadline:
                    raise AssertionError("gunicorn did not become ready within 60 s")
                time.sleep(0.1)
            yield base
        finally:
            web.send_signal(signal.SIGTERM)
            try:
                web.wait(timeout=15)
            except subprocess.TimeoutExpired:
                web.kill()
                web.wait()
