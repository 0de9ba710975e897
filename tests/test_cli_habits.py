"""The CLI's habits: --version, answers alone on stdout (JSON with --json), logs and errors on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import Caller, issue_token
from jobqueue.core.version import VERSION
from jobqueue.engine.enqueue import enqueue
from tests.helpers import WorkerHarness

REPO = Path(__file__).resolve().parent.parent
Cli = Callable[[list[str]], int]


def test_version_is_the_installed_distributions() -> None:
    done = subprocess.run([sys.executable, "-m", "jobqueue.operator.cli", "--version"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout == f"sa-core {VERSION}\n" and VERSION != "unknown"


def _answer(cli: Cli, capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    capsys.readouterr()
    assert cli(argv) == 0
    captured = capsys.readouterr()
    for line in captured.err.splitlines():
        json.loads(line)  # NOTE: whatever was logged meanwhile is JSON, and only on stderr.
    return json.loads(captured.out)


def test_every_command_that_answers_answers_json_alone_on_stdout(
    cli: Cli, capsys: pytest.CaptureFixture[str], pool: ConnectionPool[DictConnection], caller: Caller,
    workers: WorkerHarness,
) -> None:
    done = enqueue(pool, caller, "answer me")
    workers.build().run(once=True)
    queued = enqueue(pool, caller, "cancel me")

    assert _answer(cli, capsys, ["migrate", "--json"]) == {"applied": []}
    assert _answer(cli, capsys, ["reclaim-stuck-jobs", "--json"]) == {
        "requeued": 0, "failed": 0, "dependents_released": 0, "dependents_cancelled": 0}
    cancelled = _answer(cli, capsys, ["cancel-job", str(queued.job_id), "--json"])
    assert (cancelled["job_id"], cancelled["state"]) == (str(queued.job_id), "cancelled")
    retried = _answer(cli, capsys, ["retry-job", str(done.job_id), "--json"])
    assert (retried["supersedes"], retried["state"]) == (str(done.job_id), "queued")
    assert _answer(cli, capsys, ["list-jobs", "--json", "--limit", "1"])[0]["id"] == retried["job_id"]
    assert _answer(cli, capsys, ["job-details", str(done.job_id), "--json"])["job"]["state"] == "superseded"
    assert set(_answer(cli, capsys, ["queue-metrics", "--json"])) == {"since", "all", "orgs"}
    assert _answer(cli, capsys, ["prune-idempotency-keys", "--json"]) == {"deleted": 0}
    archive = _answer(cli, capsys, ["archive-old-jobs", "--before", "30d", "--dry-run", "--json"])
    assert archive["dry_run"] is True and archive["jobs"] == 0
    issued = issue_token(pool, caller.org_id, caller.user_id)
    revoked = _answer(cli, capsys, ["revoke-token", str(issued.id), "--json"])
    assert (revoked["id"], revoked["newly_revoked"]) == (issued.id, True)
    created = _answer(cli, capsys, ["create-token", "--org", "3", "--user", "4", "--json"])
    assert created["token"].startswith("sa_") and created["org_id"] == 3


def test_a_bad_argument_is_a_usage_line_and_exit_2(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli(["cancel-job", "not-a-uuid"])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
