"""Worker guarantees: conditional finalize, index-served claim, graceful SIGTERM, safe migrations."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import falcon.testing
import psycopg
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.attempt import CallRecord, CallSucceeded
from jobqueue.core.db import DictConnection
from jobqueue.core.logs import configure_logging
from jobqueue.core.policy import BackoffConfig, ErrorKind
from jobqueue.core.settings import Settings
from jobqueue.core.states import JobState
from jobqueue.core.tokens import Caller
from jobqueue.engine import finalize
from jobqueue.engine.claim import ClaimedJob, claim
from jobqueue.engine.enqueue import enqueue
from jobqueue.runtime.completer import Completer
from jobqueue.schema.migrate import migrate
from tests.helpers import fetch_all, fetch_one, submit, wait_for

WRITES = """
SELECT (SELECT count(*) FROM sa_entity WHERE kind = 'response') AS responses,
       (SELECT count(*) FROM sa_edge) AS edges,
       (SELECT count(*) FROM sa_ledger) AS ledger,
       (SELECT count(*) FROM sa_audit) AS audit
"""

LOCK_WAITS = ("SELECT count(*) AS n FROM pg_stat_activity "
              "WHERE datname = current_database() AND wait_event_type = 'Lock'")


def claimed_twice(pool: ConnectionPool[DictConnection], caller: Caller, first: str,
                  second: str) -> tuple[ClaimedJob, ClaimedJob]:
    """One job claimed by `first`, put back as if reclaimed, and claimed again by `second`."""
    enqueue(pool, caller, "claimed twice")
    [stale] = claim(pool, first, 1, 100)
    with pool.connection() as conn:
        conn.execute("UPDATE sa_job SET state = 'queued', worker_claim = NULL, attempt = 2 "
                     "WHERE id = %s", (stale.id,))
    [fresh] = claim(pool, second, 1, 100)
    return stale, fresh


def test_a_stale_claim_writes_nothing_and_the_new_owner_wins(
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    stale, fresh = claimed_twice(pool, caller, "worker-a", "worker-b")
    call = CallRecord(model="m", latency_ms=1, http_status=200)

    assert finalize.write(pool, [finalize.succeeded(stale, "late answer", call)]) == [False]
    assert fetch_one(pool, WRITES) == {"responses": 0, "edges": 0, "ledger": 0, "audit": 0}

    assert finalize.write(pool, [finalize.succeeded(fresh, "real answer", call)]) == [True]
    assert finalize.write(pool, [finalize.succeeded(fresh, "duplicate", call)]) == [False]
    assert fetch_one(pool, WRITES) == {"responses": 1, "edges": 1, "ledger": 1, "audit": 1}
    assert fetch_one(pool, "SELECT content FROM sa_entity WHERE kind = 'response'")["content"] == (
        "real answer")


def test_one_batch_finishes_each_job_by_its_own_outcome_and_skips_a_lost_claim(
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    for text in ("ok", "retry", "fail", "lost"):
        enqueue(pool, caller, text)
    ok, retry, fail, lost = claim(pool, "worker-a", 4, 100)
    with pool.connection() as conn:
        conn.execute("UPDATE sa_job SET state = 'cancelled', finished_at = now() WHERE id = %s",
                     (lost.id,))
    call = CallRecord(model="m", latency_ms=1, http_status=200)

    won = finalize.write(pool, [
        finalize.succeeded(ok, "answer", call),
        finalize.requeued(retry, ErrorKind.RATE_LIMIT, "slow down", 30.0, call),
        finalize.failed(fail, ErrorKind.PROVIDER_4XX, "no", call),
        finalize.succeeded(lost, "too late", call),
    ])

    assert won == [True, True, True, False]
    rows = {r["id"]: r for r in fetch_all(pool, "SELECT id, state, attempt, error_kind, "
                                                "scheduled_for > now() + interval '20 s' AS later "
                                                "FROM sa_job")}
    assert (rows[ok.id]["state"], rows[ok.id]["error_kind"]) == ("succeeded", None)
    assert [rows[retry.id][k] for k in ("state", "attempt", "error_kind", "later")] == [
        "queued", 2, "rate_limit", True]
    assert (rows[fail.id]["state"], rows[fail.id]["error_kind"]) == ("failed", "provider_4xx")
    assert rows[lost.id]["state"] == "cancelled"
    assert fetch_one(pool, WRITES) == {"responses": 1, "edges": 1, "ledger": 3, "audit": 1}


def test_a_stale_attempt_next_to_the_current_one_in_a_batch_writes_nothing(
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    stale, fresh = claimed_twice(pool, caller, "worker-a", "worker-a")
    call = CallRecord(model="m", latency_ms=1, http_status=200)

    won = finalize.write(pool, [finalize.succeeded(stale, "late", call),
                                 finalize.succeeded(fresh, "current", call)])

    assert won == [False, True]
    assert fetch_one(pool, WRITES) == {"responses": 1, "edges": 1, "ledger": 1, "audit": 1}
    assert fetch_one(pool, "SELECT content FROM sa_entity WHERE kind = 'response'")["content"] == (
        "current")


def test_a_job_that_cannot_be_written_fails_alone_not_its_batch(
    pool: ConnectionPool[DictConnection], caller: Caller, database_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging()
    for text in ("first", "good", "bad"):
        enqueue(pool, caller, text)
    first, good, bad = claim(pool, "worker-a", 3, 100)
    call = CallRecord(model="m", latency_ms=1, http_status=200)
    completer = Completer(pool, finalize.FinishRules(BackoffConfig()))
    results: dict[str, object] = {}

    def finish(name: str, job: ClaimedJob, content: str) -> None:
        try:
            results[name] = completer.finish(job, CallSucceeded(content, call))
        except psycopg.Error as exc:
            results[name] = type(exc).__name__

    try:
        with psycopg.connect(database_url) as locker:
            # NOTE: the first write waits on this row lock, so the next two queue up as one batch.
            locker.execute("SELECT 1 FROM sa_job WHERE id = %s FOR UPDATE", (first.id,))
            threads = [threading.Thread(target=finish, args=("first", first, "a"))]
            threads[0].start()
            wait_for(lambda: fetch_one(pool, LOCK_WAITS)["n"])
            for name, job, content in (("good", good, "b"),
                                       ("bad", bad, "NUL \x00 cannot be stored")):
                threads.append(threading.Thread(target=finish, args=(name, job, content)))
                threads[-1].start()
            wait_for(lambda: completer.waiting == 2)
        for t in threads:
            t.join(10)
    finally:
        completer.close()
    # NOTE: the bad job's outcome is not written; the job fails with the database's refusal.
    assert results == {"first": JobState.SUCCEEDED, "good": JobState.SUCCEEDED, "bad": None}
    assert completer.batches == 2, "good and bad were one batch"
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE state = 'succeeded'")["n"] == 2
    failed = fetch_one(pool, "SELECT state, error_kind, error_message FROM sa_job WHERE id = %s",
                       bad.id)
    assert (failed["state"], failed["error_kind"]) == ("failed", "unknown")
    assert "could not be written" in failed["error_message"]
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()
             if '"job.unwritable"' in line]
    assert [line["job_id"] for line in lines] == [str(bad.id)]


def test_two_workers_finalizing_the_same_job_leave_one_response(
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    enqueue(pool, caller, "raced")
    [job] = claim(pool, "worker-a", 1, 100)
    call = CallRecord(model="m", latency_ms=1, http_status=200)
    barrier = threading.Barrier(4)
    results: list[bool] = []

    def race() -> None:
        barrier.wait()
        results.append(finalize.write(pool, [finalize.succeeded(job, "answer", call)])[0])

    threads = [threading.Thread(target=race) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False, False, True]
    assert fetch_one(pool, WRITES) == {"responses": 1, "edges": 1, "ledger": 1, "audit": 1}


def test_sigterm_finishes_in_flight_work_releases_the_rest_and_exits_zero(
    client: falcon.testing.TestClient, auth: dict[str, str], settings: Settings,
    pool: ConnectionPool[DictConnection],
) -> None:
    quick = submit(client, auth, text="almost done [fake:latency=0.5]")
    stuck = submit(client, auth, text="never answers [fake:hang]")
    env = {**os.environ, "DATABASE_URL": settings.database_url,
           "SA_PROVIDER_URL": settings.provider_url, "SA_SHUTDOWN_GRACE": "1.5",
           "SA_POLL_INTERVAL": "0.05"}
    worker = subprocess.Popen([sys.executable, "-m", "jobqueue.operator.cli", "run-worker",
                               "--concurrency", "2"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE state = 'running'")[
            "n"] == 2)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=15) == 0
    finally:
        worker.kill()
    assert fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", quick["job_id"])["state"] == (
        "succeeded")
    released = fetch_one(pool, "SELECT state, attempt, worker_claim FROM sa_job WHERE id = %s",
                         stuck["job_id"])
    assert released == {"state": "queued", "attempt": 1, "worker_claim": None}
    output = worker.stdout.read().decode() if worker.stdout else ""
    assert "worker.released" in [json.loads(line)["event"] for line in output.splitlines()
                                 if line.startswith("{")]


def test_sigterm_ends_within_the_grace_while_a_provider_drips(
    client: falcon.testing.TestClient, auth: dict[str, str], settings: Settings,
    pool: ConnectionPool[DictConnection],
) -> None:
    # NOTE: the call's own deadline (60 s) is far away and every read gets a byte in time; only
    # the shutdown path can end it: grace, release, then Provider.close() must not wait on it.
    dripping = submit(client, auth, text="slowly [fake:drip=0.5]")
    env = {**os.environ, "DATABASE_URL": settings.database_url,
           "SA_PROVIDER_URL": settings.provider_url, "SA_SHUTDOWN_GRACE": "1",
           "SA_PROVIDER_TIMEOUT": "60", "SA_POLL_INTERVAL": "0.05"}
    worker = subprocess.Popen([sys.executable, "-m", "jobqueue.operator.cli", "run-worker"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s",
                                   dripping["job_id"])["state"] == "running")
        signalled = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=15) == 0
        assert time.monotonic() - signalled < 5
    finally:
        if worker.poll() is None:
            worker.kill()
    released = fetch_one(pool, "SELECT state, attempt, worker_claim FROM sa_job WHERE id = %s",
                         dripping["job_id"])
    assert released == {"state": "queued", "attempt": 1, "worker_claim": None}


def test_migrate_is_idempotent_and_safe_when_run_concurrently(database_url: str) -> None:
    scratch = f"sa_migrate_{uuid.uuid4().hex[:8]}"
    admin = psycopg.conninfo.make_conninfo(database_url, dbname="postgres")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{scratch}"')  # type: ignore[arg-type]
    url = psycopg.conninfo.make_conninfo(database_url, dbname=scratch)
    try:
        results: list[list[str]] = []
        threads = [threading.Thread(target=lambda: results.append(migrate(url))) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        shipped = Path(__file__).parent.parent / "jobqueue" / "sql" / "migrations"
        applied = sorted(p.stem for p in shipped.glob("*.sql"))
        assert sorted(results, key=len) == [[], [], applied]
        assert migrate(url) == []
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')  # type: ignore[arg-type]
