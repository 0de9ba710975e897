"""The failure model end to end: classification, backoff, Retry-After, exhausted budgets."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from tests.helpers import WorkerHarness, fetch_all, fetch_one, submit, wait_for

JOB_AND_LAST_CALL = """
SELECT j.state, j.attempt, j.error_kind, j.error_message, j.scheduled_for - l.created_at AS delay
  FROM sa_job j JOIN sa_ledger l ON l.job_id = j.id
 WHERE j.id = %s ORDER BY l.id DESC LIMIT 1
"""


def test_transient_failure_is_requeued_with_backoff_and_then_succeeds(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection], settings: Settings,
) -> None:
    job_id = submit(client, auth, text="wobbly [fake:flaky=2]")["job_id"]
    workers.build().run(once=True)
    first = fetch_one(pool, JOB_AND_LAST_CALL, job_id)
    assert (first["state"], first["attempt"], first["error_kind"]) == ("queued", 2, "provider_5xx")
    base = timedelta(seconds=settings.backoff_base)
    assert base <= first["delay"] <= 2 * base
    assert "503" in first["error_message"] and "attempt 2 of 3" in first["error_message"]

    workers.start()
    wait_for(lambda: fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", job_id)["state"]
             == "succeeded")
    calls = fetch_all(pool, "SELECT attempt, http_status, outcome FROM sa_ledger WHERE job_id = %s "
                            "ORDER BY id", job_id)
    assert [(c["attempt"], c["http_status"], c["outcome"]) for c in calls] == [
        (1, 503, "provider_5xx"), (2, 503, "provider_5xx"), (3, 200, "succeeded")]
    second_wait = fetch_all(pool, "SELECT e.at FROM sa_job_event e WHERE e.job_id = %s AND "
                                  "e.to_state = 'running' ORDER BY e.id", job_id)
    gap = second_wait[2]["at"] - second_wait[1]["at"]
    assert gap >= 5 * base
    assert fetch_one(pool, "SELECT error_kind FROM sa_job WHERE id = %s", job_id)["error_kind"] is None


@pytest.mark.parametrize(("marker", "kind", "status"), [
    ("[fake:400]", "provider_4xx", 400), ("[fake:422]", "provider_4xx", 422),
    ("[fake:401]", "auth", 401), ("[fake:403]", "auth", 403),
    ("[fake:malformed]", "parse", 200), ("[fake:empty]", "parse", 200),
    # NOTE: valid JSON that Postgres cannot store: one failed call, not paid retries as `unknown`.
    ("[fake:nul]", "parse", 200), ("[fake:surrogate]", "parse", 200),
])
def test_non_retryable_failures_fail_at_once(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection], marker: str, kind: str, status: int,
) -> None:
    job_id = submit(client, auth, text=f"doomed {marker}")["job_id"]
    workers.build().run(once=True)
    job = fetch_one(pool, "SELECT state, attempt, error_kind, error_message, finished_at "
                          "FROM sa_job WHERE id = %s", job_id)
    assert (job["state"], job["attempt"], job["error_kind"]) == ("failed", 1, kind)
    assert job["finished_at"] is not None and "not retryable" in job["error_message"]
    ledger = fetch_all(pool, "SELECT http_status, outcome FROM sa_ledger WHERE job_id = %s", job_id)
    assert [(r["http_status"], r["outcome"]) for r in ledger] == [(status, kind)]
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_entity WHERE kind = 'response'")["n"] == 0


def test_exhausted_budget_fails_with_the_last_error(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    job_id = submit(client, auth, text="always down [fake:503]", max_attempts=2)["job_id"]
    workers.start()
    wait_for(lambda: fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", job_id)["state"]
             == "failed")
    job = fetch_one(pool, "SELECT attempt, error_kind, error_message FROM sa_job WHERE id = %s", job_id)
    assert (job["attempt"], job["error_kind"]) == (2, "provider_5xx")
    assert "exhausted after 2 attempts" in job["error_message"]


def test_rate_limit_honours_retry_after_and_keeps_the_attempt(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    job_id = submit(client, auth, text="busy [fake:429=0.7]")["job_id"]
    workers.build().run(once=True)
    job = fetch_one(pool, JOB_AND_LAST_CALL, job_id)
    # NOTE: throttling is the provider's state, not the job's failure (tests/test_throttle.py).
    assert (job["state"], job["attempt"], job["error_kind"]) == ("queued", 1, "rate_limit")
    assert job["delay"] == timedelta(seconds=0.7)
    assert "attempt kept" in job["error_message"]


def test_rate_limit_without_retry_after_waits_at_least_the_minimum(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection], settings: Settings,
) -> None:
    job_id = submit(client, auth, text="busy [fake:429-nohdr]")["job_id"]
    workers.build().run(once=True)
    job = fetch_one(pool, JOB_AND_LAST_CALL, job_id)
    assert (job["state"], job["error_kind"]) == ("queued", "rate_limit")
    assert job["delay"] >= timedelta(seconds=settings.rate_limit_min_wait)


def test_provider_timeout_is_retryable_then_terminal(
    client: falcon.testing.TestClient, auth: dict[str, str], settings: Settings,
    pool: ConnectionPool[DictConnection],
) -> None:
    impatient = WorkerHarness(replace(settings, provider_timeout=0.3), pool)
    try:
        job_id = submit(client, auth, text="stall [fake:hang]", max_attempts=2)["job_id"]
        impatient.build().run(once=True)
        job = fetch_one(pool, JOB_AND_LAST_CALL, job_id)
        assert (job["state"], job["attempt"], job["error_kind"]) == ("queued", 2, "timeout")
        wait_for(lambda: impatient.build().run(once=True) or fetch_one(
            pool, "SELECT state FROM sa_job WHERE id = %s", job_id)["state"] == "failed")
        job = fetch_one(pool, JOB_AND_LAST_CALL, job_id)
        assert (job["attempt"], job["error_kind"]) == (2, "timeout")
    finally:
        impatient.stop_all()


def test_a_provider_that_drips_fails_the_attempt_as_timeout_at_the_deadline(
    client: falcon.testing.TestClient, auth: dict[str, str], settings: Settings,
    pool: ConnectionPool[DictConnection],
) -> None:
    # NOTE: a byte every 0.1 s keeps every single read well inside the 0.5 s timeout; only the
    # call's wall-clock deadline ends it.
    impatient = WorkerHarness(replace(settings, provider_timeout=0.5), pool)
    try:
        job_id = submit(client, auth, text="slowly [fake:drip=0.1]")["job_id"]
        impatient.build().run(once=True)
    finally:
        impatient.stop_all()
    job = fetch_one(pool, JOB_AND_LAST_CALL, job_id)
    assert (job["state"], job["attempt"], job["error_kind"]) == ("queued", 2, "timeout")
    assert "SA_PROVIDER_TIMEOUT=0.5s" in job["error_message"]
    call = fetch_one(pool, "SELECT latency_ms FROM sa_ledger WHERE job_id = %s", job_id)
    assert 500 <= call["latency_ms"] < 1500


def test_an_answer_past_the_size_cap_fails_once_as_parse(
    client: falcon.testing.TestClient, auth: dict[str, str], settings: Settings,
    pool: ConnectionPool[DictConnection],
) -> None:
    capped = WorkerHarness(replace(settings, provider_max_response_bytes=4096), pool)
    try:
        small = submit(client, auth, text="short [fake:bytes=1000]")["job_id"]
        large = submit(client, auth, text="long [fake:bytes=5000]")["job_id"]
        capped.build().run(once=True)
    finally:
        capped.stop_all()
    assert fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", small)["state"] == "succeeded"
    job = fetch_one(pool, "SELECT state, attempt, error_kind, error_message FROM sa_job WHERE id = %s",
                    large)
    assert (job["state"], job["attempt"], job["error_kind"]) == ("failed", 1, "parse")
    assert "larger than SA_PROVIDER_MAX_RESPONSE_BYTES=4096" in job["error_message"]
