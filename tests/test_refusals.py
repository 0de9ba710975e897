"""Refusals as a user meets them: one line naming the problem and what to do, never a traceback.
The CLI (exit 2): a duration too large for a date, a database that refuses for good, no
DATABASE_URL. The web (gunicorn stops, exit 3): a database that refuses for good."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo

from tests.hosts import free_port, procfile_command

REPO = Path(__file__).resolve().parent.parent
SA_CORE = str(Path(sys.executable).parent / "sa-core")


def _refusal(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([SA_CORE, *argv], env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (2, ""), (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["create-token", "--org", "1", "--user", "1", "--expires", "99999999d"],
    ["list-jobs", "--since", "99999999d"],
    ["usage", "--since", "99999999d"],
    ["queue-metrics", "--since", "99999999d"],
    ["archive-old-jobs", "--dry-run", "--before", "99999999d"],
])
def test_a_duration_too_large_for_a_date_is_one_line_and_exit_2(argv: list[str], database_url: str) -> None:
    line = _refusal(argv, {**os.environ, "DATABASE_URL": database_url})
    assert line.startswith(f"sa-core {argv[0]}: error: argument {argv[-2]}: '99999999d' is too long")
    assert line.endswith(f"(see sa-core {argv[0]} --help)")


def test_a_database_that_refuses_for_good_is_named_with_what_to_do(database_url: str) -> None:
    missing = make_conninfo(database_url, dbname="sa_no_such_database")
    line = _refusal(["list-jobs"], {**os.environ, "DATABASE_URL": missing})
    assert 'database "sa_no_such_database" does not exist' in line and "createdb" in line
    stranger = make_conninfo(database_url, user="sa_no_such_role")
    line = _refusal(["migrate"], {**os.environ, "DATABASE_URL": stranger})
    assert 'role "sa_no_such_role" does not exist' in line and "credentials" in line


def test_a_malformed_database_url_is_named_never_shown() -> None:
    password = f"pw-{uuid.uuid4().hex}"
    for argv in (["list-jobs"], ["run-worker"], ["dev", "--port", str(free_port())]):
        done = subprocess.run([SA_CORE, *argv], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "DATABASE_URL": f"postgres//sa:{password}@127.0.0.1/sa"})
        assert done.returncode in (1, 2) and password not in done.stdout + done.stderr
        assert "DATABASE_URL is malformed" in done.stderr, done.stderr


def test_without_database_url_a_command_says_what_to_do() -> None:
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    line = _refusal(["list-jobs"], env)
    assert line.startswith("sa-core: DATABASE_URL is not set")
    # NOTE: from a checkout: start `make run`, which prints the line to paste (test_dev.py shows
    # the answer while one runs, which another test's `sa-core dev` may be doing now).
    assert "make run" in line or "`sa-core dev` is running at" in line


def test_a_web_whose_database_refuses_for_good_stops_with_one_line_naming_it(database_url: str) -> None:
    missing = make_conninfo(database_url, dbname="sa_no_such_database")
    env = {key: value for key, value in os.environ.items() if not key.startswith("SA_")}
    env.update(DATABASE_URL=missing, PORT=str(free_port()), WEB_CONCURRENCY="1",
               PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    started = time.monotonic()
    done = subprocess.run(["sh", "-c", f"exec {procfile_command('web')}"], cwd=REPO, timeout=120,
                          env=env, capture_output=True, text=True)
    # NOTE: gunicorn's "worker failed to boot": the master stops instead of respawning the worker.
    assert done.returncode == 3 and time.monotonic() - started < 30
    events = [json.loads(line) for line in done.stderr.splitlines()]
    loud = [e for e in events if e["level"] in ("warning", "error", "critical")]
    assert [e["event"] for e in loud] == ["web.cannot_start"], loud
    assert 'database "sa_no_such_database" does not exist' in loud[0]["reason"]
    assert "Traceback" not in done.stderr
