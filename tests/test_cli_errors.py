"""The CLI's refusals as a user meets them: one line on stderr, nothing on stdout, exit code 2, and
what to do (a duration too large for a date, a database that refuses for good, no DATABASE_URL)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg.conninfo import make_conninfo

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


def test_without_database_url_a_command_says_what_to_do() -> None:
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    line = _refusal(["list-jobs"], env)
    assert line.startswith("sa-core: DATABASE_URL is not set")
    # NOTE: from a checkout: start `make run`, which prints the line to paste (test_dev.py shows
    # the answer while one runs, which another test's `sa-core dev` may be doing now).
    assert "make run" in line or "`sa-core dev` is running at" in line
