"""Scheduled prompts: `run_at` / `delay_seconds` on POST /prompt. The job waits queued (visible,
cancellable), no worker polls for it, and it runs once due on the due-time wake-up."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from tests.helpers import WorkerHarness, fetch_one, job_state, submit, wait_for

NEVER = 600.0
PROMPT = "/sa-core/v1/prompt"


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def test_a_delayed_prompt_waits_then_runs_on_its_wakeup_without_polling(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    worker = workers.start(listen=True, poll_interval=NEVER)
    wait_for(lambda: worker.claim_rounds >= 1)
    job_id = submit(client, auth, text="later", delay_seconds=2)["job_id"]

    job = client.simulate_get(f"/sa-core/v1/jobs/{job_id}", headers=auth).json
    assert job["state"] == "queued"
    due = datetime.fromisoformat(job["scheduled_for"])
    assert timedelta(seconds=1.5) < due - datetime.now(UTC) <= timedelta(seconds=2)

    wait_for(lambda: job_state(client, auth, job_id) == "succeeded", timeout=10)
    claimed = fetch_one(pool, "SELECT claimed_at FROM sa_job WHERE id = %s", job_id)["claimed_at"]
    # NOTE: never before its time, and within a second of it (the poll is ten minutes away).
    assert due <= claimed < due + timedelta(seconds=1)


def test_run_at_sets_the_time_and_the_job_is_cancellable_while_it_waits(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
) -> None:
    workers.start(listen=True, poll_interval=0.05)
    run_at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    job_id = submit(client, auth, text="at two", run_at=_iso(run_at))["job_id"]
    job = client.simulate_get(f"/sa-core/v1/jobs/{job_id}", headers=auth).json
    assert datetime.fromisoformat(job["scheduled_for"]) == run_at

    # NOTE: a worker polling every 50 ms leaves it alone: it is not due.
    time.sleep(0.3)
    assert job_state(client, auth, job_id) == "queued"
    cancelled = client.simulate_post(f"/sa-core/v1/jobs/{job_id}/cancel", headers=auth)
    assert cancelled.status_code == 200, cancelled.text
    assert job_state(client, auth, job_id) == "cancelled"


@pytest.mark.parametrize(("body", "named"), [
    ({"run_at": "2020-01-01T00:00:00Z"}, "run_at: is in the past"),
    ({"run_at": "9999-01-01T00:00:00Z"}, "run_at: must be at most"),
    ({"run_at": "2026-12-01"}, "run_at: must be an ISO 8601 date-time"),
    ({"run_at": "tomorrow"}, "run_at: must be an ISO 8601 date-time"),
    ({"delay_seconds": -1}, "delay_seconds: must be between"),
    ({"delay_seconds": 10**9}, "delay_seconds: must be between"),
    ({"delay_seconds": 5, "run_at": "2099-01-01T00:00:00Z"}, "delay_seconds: cannot be given"),
])
def test_past_absurd_or_conflicting_times_answer_422_and_queue_nothing(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
    body: dict[str, object], named: str,
) -> None:
    result = client.simulate_post(PROMPT, json={"text": "when?", **body}, headers=auth)
    assert result.status_code == 422
    assert named in result.json["description"]
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == 0


def test_a_scheduled_submit_with_a_key_replays_and_a_different_time_is_refused(
    client: falcon.testing.TestClient, auth: dict[str, str],
) -> None:
    headers = {**auth, "Idempotency-Key": "sched-1"}
    first = client.simulate_post(PROMPT, json={"text": "x", "delay_seconds": 60}, headers=headers)
    again = client.simulate_post(PROMPT, json={"text": "x", "delay_seconds": 60}, headers=headers)
    other = client.simulate_post(PROMPT, json={"text": "x", "delay_seconds": 61}, headers=headers)
    assert first.status_code == again.status_code == 202
    assert again.json["job_id"] == first.json["job_id"]
    assert other.status_code == 422


def test_an_operator_sees_a_waiting_job_and_cancels_it_from_the_cli(
    client: falcon.testing.TestClient, auth: dict[str, str],
    cli: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str],
) -> None:
    run_at = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
    job_id = submit(client, auth, text="tomorrow", run_at=_iso(run_at))["job_id"]
    capsys.readouterr()

    assert cli(["job-details", job_id, "--json"]) == 0
    job = json.loads(capsys.readouterr().out)["job"]
    assert (job["state"], datetime.fromisoformat(job["scheduled_for"])) == ("queued", run_at)
    assert cli(["cancel-job", job_id]) == 0
    assert job_state(client, auth, job_id) == "cancelled"


def _claimed_within_a_second_of_due(pool: ConnectionPool[DictConnection], job_id: str) -> bool:
    row = fetch_one(pool, "SELECT claimed_at, scheduled_for FROM sa_job WHERE id = %s", job_id)
    return bool(row["scheduled_for"] <= row["claimed_at"]
                < row["scheduled_for"] + timedelta(seconds=1))


def test_a_job_due_sooner_than_one_heard_of_before_does_not_make_the_worker_forget_it(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    worker = workers.start(listen=True, poll_interval=NEVER)
    wait_for(lambda: worker.claim_rounds >= 1)
    later = submit(client, auth, text="due second", delay_seconds=3)["job_id"]
    sooner = submit(client, auth, text="due first", delay_seconds=1)["job_id"]
    wait_for(lambda: job_state(client, auth, later) == "succeeded", timeout=10)
    assert job_state(client, auth, sooner) == "succeeded"
    assert _claimed_within_a_second_of_due(pool, sooner)
    assert _claimed_within_a_second_of_due(pool, later)


def test_a_worker_started_after_a_job_was_scheduled_runs_it_on_time_without_its_wakeup(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    job_id = submit(client, auth, text="scheduled before any worker", delay_seconds=2)["job_id"]
    # NOTE: no LISTEN and a ten-minute poll: only the worker's question to the database tells it.
    workers.start(poll_interval=NEVER)
    wait_for(lambda: job_state(client, auth, job_id) == "succeeded", timeout=10)
    assert _claimed_within_a_second_of_due(pool, job_id)
