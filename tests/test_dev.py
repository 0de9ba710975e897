"""`sa-core dev` as a newcomer sees it: a quiet start, one line to paste in another terminal, the
worker's metrics served beside the web's, and a CLI without DATABASE_URL that says what to paste."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.helpers import wait_for
from tests.hosts import free_port

# NOTE: the whole module on one xdist worker (make test's --dist loadgroup), so its
# module-scoped `sa-core dev` starts once.
pytestmark = pytest.mark.xdist_group("dev")

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


class Dev:
    """`sa-core dev` in its own process group, its stdout and stderr lines kept in order."""

    def __init__(self, port: int, env: dict[str, str]) -> None:
        self.lines: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self.child = subprocess.Popen([str(BIN / "sa-core"), "dev", "--port", str(port)], env=env,
                                      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, process_group=0)
        self._readers = [threading.Thread(target=self._read, args=(stream, name), daemon=True)
                         for stream, name in ((self.child.stdout, "out"), (self.child.stderr, "err"))]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: object, name: str) -> None:
        for line in stream:  # type: ignore[attr-defined]
            with self._lock:
                self.lines.append((name, line.rstrip("\n")))

    def seen(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self.lines)

    def exports(self) -> str | None:
        return next((line for _, line in self.seen() if line.startswith("export ")), None)

    def stop(self) -> int:
        """Ctrl-C, as a terminal sends it to the foreground process."""
        if self.child.poll() is None:
            os.kill(self.child.pid, signal.SIGINT)
        code = self.child.wait(timeout=60)
        for reader in self._readers:
            reader.join(timeout=10)
        return code


@pytest.fixture(scope="module")
def dev(database_url: str) -> Iterator[tuple[Dev, int]]:
    """One `sa-core dev` for the module, on a database of its own (not the tests' one, which each
    test empties)."""
    name = f"sa_dev_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    port = free_port()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("SA_") and key not in ("LOG_LEVEL", "DATABASE_URL")}
    running = Dev(port, {**env, "DATABASE_URL": make_conninfo(database_url, dbname=name)})
    try:
        wait_for(running.exports, timeout=90, interval=0.1)
        yield running, port
    finally:
        assert running.stop() == 0, running.seen()[-20:]
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _environment(exports: str) -> dict[str, str]:
    """The environment a shell has after pasting `exports`."""
    done = subprocess.run(["bash", "-c", f"{exports}\nenv -0"], capture_output=True, check=True,
                          env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")})
    return dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)


def test_the_start_is_quiet_and_the_banner_gives_the_line_to_paste(dev: tuple[Dev, int]) -> None:
    running, port = dev
    before = running.seen()[:next(i for i, (_, line) in enumerate(running.seen())
                                  if line.startswith("export "))]
    # NOTE: nothing but sa-core dev's own words until the service is ready: no warning, no JSON
    # log line of gunicorn, the worker, the embedded Postgres or a library.
    assert [line for _, line in before
            if not line.startswith(("==", "sa-core dev: "))] == [], before
    env = _environment(running.exports() or "")
    assert env["SA_API_URL"] == f"http://127.0.0.1:{port}"
    # NOTE: the web's port + 1 when it is free, else any free one (a busy machine may hold it);
    # the banner names it either way.
    worker_metrics = env["SA_WORKER_METRICS_URL"]
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", worker_metrics), worker_metrics
    assert any(line.endswith(f"worker {worker_metrics}") for _, line in before), before
    # NOTE: the pasted line is all another terminal needs: the CLI finds the web and the database.
    answer = subprocess.run(["sa-core", "run-prompt", "Hello from another terminal"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.startswith("echo[1]: user:Hello from another terminal")
    listed = subprocess.run(["sa-core", "list-jobs", "--json", "--limit", "1"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and listed.stderr == ""
    assert [job["state"] for job in json.loads(listed.stdout)] == ["succeeded"]


def test_the_workers_metrics_are_served_and_count_what_the_web_cannot_see(dev: tuple[Dev, int]) -> None:
    running, port = dev
    env = _environment(running.exports() or "")
    web_url = f"http://127.0.0.1:{port}/metrics"
    before = {"web": _counted(web_url), "worker": _counted(env["SA_WORKER_METRICS_URL"])}
    for text in ("count me", "and me"):
        assert subprocess.run(["sa-core", "run-prompt", text], env=env, capture_output=True,
                              timeout=60).returncode == 0
    # NOTE: the worker's page counts the claims and successes; the web's, which only ever sees
    # the submits, has no running -> succeeded at all (two web processes pool their counts).
    wait_for(lambda: _counted(env["SA_WORKER_METRICS_URL"])["running->succeeded"]
             == before["worker"]["running->succeeded"] + 2, timeout=10, interval=0.2)
    worker = _counted(env["SA_WORKER_METRICS_URL"])
    assert worker["queued->running"] == before["worker"]["queued->running"] + 2
    web = _counted(web_url)
    assert web["none->queued"] == before["web"]["none->queued"] + 2
    assert web["running->succeeded"] == 0 and worker["none->queued"] == 0


def _counted(url: str) -> dict[str, float]:
    """sa_job_transitions_total of one metrics page, by `from->to` (0 for a transition absent)."""
    found = re.findall(r'^sa_job_transitions_total\{from_state="(\w+)",to_state="(\w+)"\} (\S+)$',
                       httpx.get(url, timeout=5).text, re.MULTILINE)
    counts = {f"{source}->{target}": float(value) for source, target, value in found}
    for name in ("none->queued", "queued->running", "running->succeeded"):
        counts.setdefault(name, 0.0)
    return counts


def test_probes_are_not_logged_at_info_but_requests_are(dev: tuple[Dev, int]) -> None:
    running, port = dev
    base = f"http://127.0.0.1:{port}"
    for path in ("/healthz", "/readyz", "/metrics"):
        assert httpx.get(base + path, timeout=5).status_code == 200
    assert httpx.get(f"{base}/sa-core/v1/jobs/00000000-0000-0000-0000-000000000000",
                     timeout=5).status_code == 401

    def logged() -> list[dict[str, object]]:
        return [json.loads(line) for name, line in running.seen()
                if name == "err" and '"http.request"' in line]

    wait_for(lambda: any(e["status"] == 401 for e in logged()), timeout=10, interval=0.1)
    assert not {"/healthz", "/readyz", "/metrics"} & {e["route"] for e in logged()}


def test_a_command_without_database_url_says_which_line_to_paste(dev: tuple[Dev, int]) -> None:
    running, _ = dev
    env = {key: value for key, value in _environment(running.exports() or "").items()
           if key != "DATABASE_URL"}
    done = subprocess.run(["sa-core", "list-jobs"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert "`sa-core dev` is running at http://127.0.0.1:" in line
    assert "export DATABASE_URL=" in line
