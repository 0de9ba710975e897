"""Workers wake on LISTEN/NOTIFY instead of waiting for the poll; the poll stays as the fallback."""

from __future__ import annotations

import falcon.testing
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from tests.conftest import WorkerHarness, fetch_one, wait_for
from tests.helpers import job_state, submit

NEVER = 600.0


def test_an_idle_worker_claims_on_notification_long_before_its_poll(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
) -> None:
    worker = workers.start(listen=True, poll_interval=NEVER)
    wait_for(lambda: worker.claim_rounds >= 1)
    idle_rounds = worker.claim_rounds

    job_id = submit(client, auth, text="wake up")["job_id"]

    wait_for(lambda: job_state(client, auth, job_id) == "succeeded")
    assert worker.claim_rounds > idle_rounds


def test_a_retry_with_backoff_is_claimed_when_due_without_polling(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    worker = workers.start(listen=True, poll_interval=NEVER)
    wait_for(lambda: worker.claim_rounds >= 1)
    job_id = submit(client, auth, text="second time lucky [fake:flaky=1]")["job_id"]

    wait_for(lambda: job_state(client, auth, job_id) == "succeeded")
    assert fetch_one(pool, "SELECT attempt FROM sa_job WHERE id = %s", job_id)["attempt"] == 2


def test_without_listen_the_poll_still_finds_the_job(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
) -> None:
    worker = workers.start(listen=False, poll_interval=0.1)
    wait_for(lambda: worker.claim_rounds >= 1)
    job_id = submit(client, auth, text="found by polling")["job_id"]
    wait_for(lambda: job_state(client, auth, job_id) == "succeeded")
