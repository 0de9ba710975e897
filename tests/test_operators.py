"""Operator CLI: list-jobs, job-details, queue-metrics and archive-old-jobs against a real database."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import archive as archive_q
from jobqueue.core.queries import inspection as inspection_q
from jobqueue.core.tokens import Caller
from jobqueue.runtime.archive import ArchiveCounts, Archiver
from tests.helpers import fetch_all, fetch_one
from tests.scenario import Scenario

Cli = Callable[[list[str]], int]


@pytest.fixture
def org1(pool: ConnectionPool[DictConnection]) -> Scenario:
    return Scenario(pool, Caller(org_id=1, user_id=10))


@pytest.fixture
def org2(pool: ConnectionPool[DictConnection]) -> Scenario:
    return Scenario(pool, Caller(org_id=2, user_id=20))


def run_json(cli: Cli, capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    capsys.readouterr()
    assert cli(argv) == 0
    return json.loads(capsys.readouterr().out)


def db_now(pool: ConnectionPool[DictConnection]) -> datetime:
    return fetch_one(pool, "SELECT clock_timestamp() AS now")["now"]  # type: ignore[no-any-return]


# --- list-jobs ---------------------------------------------------------------------------------


def test_list_jobs_filters_by_state_org_and_since_newest_first(
    cli: Cli, capsys: pytest.CaptureFixture[str], org1: Scenario, org2: Scenario,
    pool: ConnectionPool[DictConnection],
) -> None:
    failed = org1.failed()
    done = org1.succeeded()
    other = org2.queued()
    later = db_now(pool)
    newest = org1.queued()

    everything = run_json(cli, capsys, ["list-jobs", "--json"])
    assert [j["id"] for j in everything] == [str(newest), str(other), str(done), str(failed)]
    assert "content" not in everything[0] and "text" not in everything[0]
    assert [j["id"] for j in run_json(cli, capsys, ["list-jobs", "--state", "failed", "--json"])] == [
        str(failed)]
    assert [j["id"] for j in run_json(cli, capsys, ["list-jobs", "--org", "2", "--json"])] == [str(other)]
    assert [j["id"] for j in run_json(cli, capsys, ["list-jobs", "--since", later.isoformat(),
                                                    "--json"])] == [str(newest)]
    assert len(run_json(cli, capsys, ["list-jobs", "--since", "1h", "--limit", "2", "--json"])) == 2
    assert run_json(cli, capsys, ["list-jobs", "--state", "cancelled", "--json"]) == []

    assert cli(["list-jobs", "--state", "failed"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["JOB", "ID", "STATE"]
    assert table[1].split()[:4] == [str(failed), "failed", "1", "10"]
    assert "provider_4xx" in table[1]
    assert table[-1] == "1 job(s), newest first"


@pytest.mark.parametrize("argv", [
    ["list-jobs", "--state", "stuck"],
    ["list-jobs", "--since", "last tuesday"],
    ["list-jobs", "--limit", "0"],
    ["list-jobs", "--org", "x"],
    ["job-details", "not-a-uuid"],
    ["archive-old-jobs"],
    ["archive-old-jobs", "--before", "2999-01-01"],
    ["archive-old-jobs", "--before", "soon"],
    ["queue-metrics", "--since", "5 parsecs"],
])
def test_bad_arguments_exit_2_with_a_message(
    cli: Cli, capsys: pytest.CaptureFixture[str], argv: list[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli(argv)
    assert exited.value.code == 2
    assert "error:" in capsys.readouterr().err


# --- job-details -------------------------------------------------------------------------------


def test_job_details_prints_the_job_its_prompt_and_every_transition_by_state_name(
    cli: Cli, capsys: pytest.CaptureFixture[str], org1: Scenario,
) -> None:
    job_id = org1.retried_then_succeeded(text="What is the airspeed of a swallow?")

    capsys.readouterr()
    assert cli(["job-details", str(job_id)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"job {job_id}\n")
    assert "  state          succeeded\n" in out
    assert "  attempt        2 of 3\n" in out
    assert "What is the airspeed of a swallow?" in out
    assert f"reply to {job_id}" in out
    history = out.split("transitions (5)\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split()[3:5] for line in history[1:]] == [
        ["(created)", "queued"], ["queued", "running"], ["running", "queued"],
        ["queued", "running"], ["running", "succeeded"]]
    assert "rate_limit" in history[3]
    assert "provider calls (2)" in out

    document = run_json(cli, capsys, ["job-details", str(job_id), "--json"])
    assert document["job"]["id"] == str(job_id)
    assert [(t["from_state"], t["to_state"]) for t in document["transitions"]] == [
        (None, "queued"), ("queued", "running"), ("running", "queued"), ("queued", "running"),
        ("running", "succeeded")]
    assert [c["outcome"] for c in document["provider_calls"]] == ["rate_limit", "succeeded"]
    assert document["prompt"]["content"] == "What is the airspeed of a swallow?"


def test_job_details_of_an_unknown_id_exits_1(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    missing = uuid.uuid4()
    capsys.readouterr()
    assert cli(["job-details", str(missing)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == f"sa-core: job {missing} not found"


COMMANDS = [["list-jobs"], ["cancel-job", str(uuid.uuid4())], ["revoke-token", "sa_unknown"],
            ["prune-idempotency-keys"], ["migrate"]]


# NOTE: the two ways a command connects (the CLI pool of every operator command, and migrate's
# own connection): each waits its 2 s once here; a refused port tells every command apart below.
@pytest.mark.parametrize("command", [["list-jobs"], ["migrate"]])
def test_an_unreachable_database_exits_1_with_one_line_in_about_two_seconds(
    cli: Cli, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    command: list[str],
) -> None:
    # NOTE: a listener that never accepts: the TCP handshake completes (the kernel's backlog) and
    # the server then says nothing, the worst case (a hung host); a refused port fails at once.
    with socket.create_server(("127.0.0.1", 0), backlog=8) as silent:
        port = silent.getsockname()[1]
        monkeypatch.setenv("DATABASE_URL", f"postgresql://postgres:hunter2@127.0.0.1:{port}/sa")
        capsys.readouterr()
        started = time.monotonic()
        assert cli(command) == 1
        elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("sa-core: database unreachable: ") and "timeout" in lines[0]
    assert "hunter2" not in captured.err
    assert elapsed < 5, f"took {elapsed:.1f}s"


@pytest.mark.parametrize("command", COMMANDS)
def test_a_refused_database_exits_1_with_one_line(
    cli: Cli, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    command: list[str],
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    monkeypatch.setenv("DATABASE_URL", f"postgresql://postgres:hunter2@127.0.0.1:{port}/sa")
    capsys.readouterr()
    assert cli(command) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    refused = captured.err.splitlines()
    assert len(refused) == 1 and "refused" in refused[0], refused
    assert "hunter2" not in captured.err


# --- queue-metrics -----------------------------------------------------------------------------


def _expected_waits(pool: ConnectionPool[DictConnection]) -> list[float]:
    """Creation to first claim of every job, straight from the event log."""
    rows = fetch_all(pool, """
        SELECT extract(epoch FROM min(at) FILTER (WHERE to_state = 'running')
                                 - min(at) FILTER (WHERE from_state IS NULL))::float8 AS wait
          FROM sa_job_event GROUP BY job_id
        HAVING count(*) FILTER (WHERE to_state = 'running') > 0""")
    return sorted(r["wait"] for r in rows)


def test_queue_metrics_match_the_database(
    cli: Cli, capsys: pytest.CaptureFixture[str], org1: Scenario, org2: Scenario,
    pool: ConnectionPool[DictConnection],
) -> None:
    org1.succeeded()
    org1.retried_then_succeeded()
    org1.failed()
    org1.cancelled()
    org2.failed()
    org2.running()
    org2.queued()
    org1.queued()

    report = run_json(cli, capsys, ["queue-metrics", "--json"])

    overall, orgs = report["all"], {o["org_id"]: o for o in report["orgs"]}
    counts = fetch_all(pool, "SELECT org_id, state, count(*) AS n FROM sa_job GROUP BY 1, 2")
    for org_id, figures in orgs.items():
        expected = {r["state"]: r["n"] for r in counts if r["org_id"] == org_id}
        assert {s: n for s, n in figures["jobs_by_state"].items() if n} == expected
    assert overall["jobs_by_state"] == {"queued": 2, "running": 1, "succeeded": 2, "failed": 2,
                                        "cancelled": 1, "superseded": 0}
    assert overall["queued_due"] == 2 and orgs[1]["queued_due"] == orgs[2]["queued_due"] == 1
    oldest = fetch_one(pool, "SELECT extract(epoch FROM now() - min(scheduled_for))::float8 AS s "
                             "FROM sa_job WHERE state = 'queued'")["s"]
    assert overall["oldest_queued_seconds"] == pytest.approx(oldest, abs=1.0)

    # 5 jobs were claimed (first claims), 5 attempts ended: 2 errors of org 1 (a retried rate
    # limit, a 4xx), 1 of org 2; the running job's attempt has not ended.
    assert (overall["claims"], overall["attempts"], overall["errors"]) == (5, 5, 3)
    assert (orgs[1]["claims"], orgs[1]["attempts"], orgs[1]["errors"]) == (3, 4, 2)
    assert (orgs[2]["claims"], orgs[2]["attempts"], orgs[2]["errors"]) == (2, 1, 1)
    assert overall["error_rate"] == pytest.approx(3 / 5)
    assert overall["errors_by_kind"] == {
        "provider_4xx": {"errors": 2, "rate": pytest.approx(2 / 5)},
        "rate_limit": {"errors": 1, "rate": pytest.approx(1 / 5)}}
    assert orgs[2]["errors_by_kind"] == {"provider_4xx": {"errors": 1, "rate": 1.0}}
    waits = _expected_waits(pool)
    assert overall["wait_seconds"]["mean"] == pytest.approx(sum(waits) / len(waits), rel=1e-6)
    assert overall["wait_seconds"]["p95"] <= max(waits) + 1e-9
    assert overall["run_seconds"]["mean"] > 0

    assert run_json(cli, capsys, ["queue-metrics", "--since", "2999-01-01", "--json"])["all"][
        "attempts"] == 0
    assert cli(["queue-metrics"]) == 0
    text = capsys.readouterr().out
    for heading in ("jobs by state", "wait (created -> first claim)", "errors by kind"):
        assert heading in text
    assert "provider_4xx" in text and "40.0%" in text


def test_the_queue_metrics_window_is_served_by_the_event_brin_index(
    pool: ConnectionPool[DictConnection], truncated_tables: None,
) -> None:
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = conn.execute("EXPLAIN (FORMAT JSON) " + inspection_q.JOB_EVENT_LATENCY_SINCE,
                            {"since": datetime.now(UTC)}).fetchone()
    assert plan is not None
    assert "sa_job_event_at_brin" in json.dumps(plan)


# --- archive-old-jobs --------------------------------------------------------------------------


ARCHIVED_IDS = "SELECT id FROM sa_job_archive ORDER BY id"


def _hot_state(pool: ConnectionPool[DictConnection]) -> dict[str, int]:
    return fetch_one(pool, """
        SELECT (SELECT count(*) FROM sa_job) AS jobs, (SELECT count(*) FROM sa_job_event) AS events,
               (SELECT count(*) FROM sa_ledger) AS ledger, (SELECT count(*) FROM sa_entity) AS entities,
               (SELECT count(*) FROM sa_audit) AS audit, (SELECT count(*) FROM sa_edge) AS edges""")


def _related(pool: ConnectionPool[DictConnection], ids: list[uuid.UUID]) -> dict[str, int]:
    return fetch_one(pool, "SELECT (SELECT count(*) FROM sa_job_event WHERE job_id = ANY(%s)) AS events, "
                           "(SELECT count(*) FROM sa_ledger WHERE job_id = ANY(%s)) AS ledger", ids, ids)


def test_archive_moves_whole_finished_prompt_families_and_nothing_else(
    cli: Cli, capsys: pytest.CaptureFixture[str], org1: Scenario, org2: Scenario,
    pool: ConnectionPool[DictConnection],
) -> None:
    # Old, finished, and alone on their prompt: move.
    movable = [org1.succeeded(), org1.failed(), org2.cancelled(), org1.retried_then_succeeded()]
    chain_old = org1.failed()
    chain_new = org1.retry(chain_old)           # a finished chain of two: moves whole
    kept_old = org2.failed()
    kept_new = org2.retry(kept_old, answer=False)  # superseded by a job still queued: stays
    kept = [org1.queued(), org2.running(), kept_old, kept_new]
    cutoff = db_now(pool)
    late = [org1.succeeded(), org2.queued()]     # created after the cutoff
    movable_all = sorted([*movable, chain_old, chain_new])
    expected_moves = _related(pool, movable_all)
    before = _hot_state(pool)

    capsys.readouterr()
    argv = ["archive-old-jobs", "--before", cutoff.isoformat(), "--batch-size", "2"]
    assert cli([*argv, "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert (f"dry run: would archive 6 job(s) of 5 prompt(s), {expected_moves['events']} event(s), "
            f"{expected_moves['ledger']} ledger row(s)") in dry
    assert _hot_state(pool) == before and fetch_all(pool, ARCHIVED_IDS) == []

    assert cli(argv) == 0
    assert (f"archived 6 job(s) of 5 prompt(s), {expected_moves['events']} event(s), "
            f"{expected_moves['ledger']} ledger row(s)") in capsys.readouterr().out

    assert [r["id"] for r in fetch_all(pool, ARCHIVED_IDS)] == movable_all
    remaining = {r["id"] for r in fetch_all(pool, "SELECT id FROM sa_job")}
    assert remaining == {*kept, *late}
    assert _related(pool, movable_all) == {"events": 0, "ledger": 0}
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job_event_archive")["n"] == expected_moves["events"]
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_ledger_archive")["n"] == expected_moves["ledger"]
    after = _hot_state(pool)
    assert (after["entities"], after["audit"], after["edges"]) == (
        before["entities"], before["audit"], before["edges"])
    assert fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", kept[1])["state"] == "running"

    # An archived job still has its details, read from the archive.
    document = run_json(cli, capsys, ["job-details", str(chain_old), "--json"])
    assert document["job"]["archived_at"] is not None
    assert document["job"]["superseded_by"] == str(chain_new)
    assert [t["to_state"] for t in document["transitions"]] == [
        "queued", "running", "failed", "superseded"]

    assert cli(argv) == 0
    assert "archived 0 job(s)" in capsys.readouterr().out


def test_archive_passes_over_locked_rows_without_waiting(
    org1: Scenario, pool: ConnectionPool[DictConnection], database_url: str,
) -> None:
    busy, free = org1.succeeded(), org1.succeeded()
    cutoff = db_now(pool)
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM sa_job WHERE id = %s FOR UPDATE", (busy,))
        batches: list[ArchiveCounts] = []
        done = threading.Event()

        def archive() -> None:
            Archiver(pool, Archiver.Config(batch_size=1, statement_timeout=5.0),
                     on_batch=batches.append).run_once(cutoff)
            done.set()

        threading.Thread(target=archive, daemon=True).start()
        assert done.wait(5), "the archive waited on a locked row"
        holder.rollback()
    assert [r["id"] for r in fetch_all(pool, ARCHIVED_IDS)] == [free]
    assert sum(b.jobs for b in batches) == 1
    assert Archiver(pool).run_once(cutoff).jobs == 1
    assert {r["id"] for r in fetch_all(pool, ARCHIVED_IDS)} == {busy, free}


def _plan(conn: psycopg.Connection[Any], statement: str, params: dict[str, Any]) -> str:
    row = conn.execute("EXPLAIN (FORMAT JSON) " + statement, params).fetchone()
    assert row is not None
    return json.dumps(row)


def test_archive_and_list_walk_the_created_index(many_jobs: psycopg.Connection[Any]) -> None:
    pick = _plan(many_jobs, archive_q.JOB_ARCHIVE_PICK_MANY, {
        "before": datetime.now(UTC), "after_created_at": datetime.min.replace(tzinfo=UTC),
        "after_id": uuid.UUID(int=0), "limit": 20})
    assert "sa_job_created_idx" in pick and "sa_job_prompt_idx" in pick
    listing = _plan(many_jobs, inspection_q.JOB_LIST_ANY_ORG,
                    {"state": None, "org_id": None, "since": None, "limit": 50})
    assert "sa_job_created_idx" in listing and "Seq Scan" not in listing
