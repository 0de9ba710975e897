"""Workers wake on LISTEN/NOTIFY instead of waiting for the poll; the poll stays as the fallback."""

from __future__ import annotations

from functools import partial

import falcon.testing
import psycopg
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.wakeup import WakeupSender
from tests.helpers import WorkerHarness, fetch_all, fetch_one, job_state, submit, wait_for

NEVER = 600.0
JOBS_ONE_BY_ONE = 12


def test_an_idle_worker_claims_on_notification_long_before_its_poll(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
) -> None:
    worker = workers.start(listen=True, poll_interval=NEVER)
    wait_for(lambda: worker.claim_rounds >= 1)
    idle_rounds = worker.claim_rounds

    job_id = submit(client, auth, text="wake up")["job_id"]

    wait_for(lambda: job_state(client, auth, job_id) == "succeeded")
    assert worker.claim_rounds > idle_rounds


def test_at_a_trickle_a_worker_claims_about_once_a_job(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
) -> None:
    worker = workers.start(listen=True, poll_interval=NEVER, concurrency=8)
    wait_for(lambda: worker.claim_rounds >= 1)
    idle_rounds = worker.claim_rounds

    for n in range(JOBS_ONE_BY_ONE):
        job_id: str = submit(client, auth, text=f"one by one {n}")["job_id"]
        wait_for(partial(_succeeded_one, client, auth, job_id))

    # A freed slot starts no round when the last one found nothing more to take: each job's
    # wake-up claims it, and its call's end and its finalize add nothing (they added two
    # empty claims a job before).
    rounds = worker.claim_rounds - idle_rounds
    assert JOBS_ONE_BY_ONE <= rounds <= JOBS_ONE_BY_ONE * 3 // 2, rounds


def _succeeded_one(client: falcon.testing.TestClient, auth: dict[str, str], job_id: str) -> bool:
    return job_state(client, auth, job_id) == "succeeded"


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


# NOTE: jobs written straight to the table: the trigger no longer notifies, so the only wake-ups
# are the ones the test's own sender sends.
QUEUE_JOBS = """
WITH prompt AS (
    INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, content)
    SELECT g, 'prompt', 1, 10, g, 'burst' FROM (SELECT gen_random_uuid() AS g
                                                  FROM generate_series(1, %s)) s
    RETURNING id
)
INSERT INTO sa_job (id, prompt_id, org_id, created_by)
SELECT gen_random_uuid(), id, 1, 10 FROM prompt
RETURNING id
"""


def _succeeded(pool: ConnectionPool[DictConnection], job_ids: list[str]) -> bool:
    row = fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE id = ANY(%s::uuid[]) "
                          "AND state = 'succeeded'", job_ids)
    return bool(row["n"] == len(job_ids))


def test_a_burst_of_wakeups_is_coalesced_while_an_idle_worker_hears_the_first_at_once(
    database_url: str, pool: ConnectionPool[DictConnection], workers: WorkerHarness,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as counter:
        counter.execute("LISTEN sa_job_queued")
        counter.execute("LISTEN sa_test_done")
        worker = workers.start(listen=True, poll_interval=NEVER)
        wait_for(lambda: worker.claim_rounds >= 1)
        # A window far longer than the test: only the leading edge can wake the worker in time.
        sender = WakeupSender(database_url, interval=NEVER)

        first = [str(r["id"]) for r in fetch_all(pool, QUEUE_JOBS, 1)]
        sender.job_queued()
        wait_for(lambda: _succeeded(pool, first))

        burst = [str(r["id"]) for r in fetch_all(pool, QUEUE_JOBS, 49)]
        for _ in burst:
            sender.job_queued()
        sender.close()  # sends what the window holds
        wait_for(lambda: _succeeded(pool, burst))

        # Notifications arrive in commit order: once this one is in, every wake-up is counted.
        with pool.connection() as conn:
            conn.execute("NOTIFY sa_test_done")
        heard = []
        for notify in counter.notifies(timeout=10):
            if notify.channel == "sa_test_done":
                break
            heard.append(notify.payload)
    assert heard == ["", ""], "50 jobs queued: one wake-up at once, one for the rest of the window"
    assert sender.sent == 2


def test_a_wakeup_sender_whose_connection_died_reconnects_and_still_sends(
    database_url: str, pool: ConnectionPool[DictConnection],
) -> None:
    with psycopg.connect(database_url, autocommit=True) as counter:
        counter.execute("LISTEN sa_job_event")
        sender = WakeupSender(database_url, interval=0.0)
        sender.job_changed()
        assert next(counter.notifies(timeout=10)).channel == "sa_job_event"
        killed = fetch_all(pool, "SELECT pg_terminate_backend(pid) AS done FROM pg_stat_activity "
                                 "WHERE application_name = 'sa-core wakeup' "
                                 "AND datname = current_database()")
        assert killed and all(r["done"] for r in killed)

        sender.job_changed()
        heard = next(counter.notifies(timeout=10), None)
        sender.close()
    assert heard is not None and heard.channel == "sa_job_event"
    assert sender.sent == 2
