"""The maintenance leader's session and its retention: keepalives, archive and key pruning."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import Caller
from jobqueue.engine.control import cancel_job
from jobqueue.engine.enqueue import enqueue
from jobqueue.engine.reclaim import Reclaimer
from jobqueue.runtime.maintenance import MaintenanceLeader
from jobqueue.runtime.retention import Retention, RetentionCounts
from tests.helpers import fetch_all, fetch_one, wait_for

__all__: list[str] = []

FAST = MaintenanceLeader.Config(reclaim_interval=0.1, lock_retry_interval=0.05,
                                reconnect_delay=0.1, connect_timeout=5.0,
                                retention_interval=0.1)
DAY = 86400.0


@pytest.fixture
def leader(database_url: str) -> Iterator[MaintenanceLeader]:
    runner = MaintenanceLeader(database_url, Reclaimer.Config(), FAST,
                               retention=Retention.Config(archive_after=30 * DAY))
    yield runner.start()
    runner.stop()


def finished_job(pool: ConnectionPool[DictConnection], caller: Caller, text: str) -> Any:
    job_id = enqueue(pool, caller, text).job_id
    cancel_job(pool, job_id, None)
    return job_id


def test_leader_session_sets_server_side_tcp_keepalives(leader: MaintenanceLeader) -> None:
    assert leader.became_leader.wait(10)

    # Read back by the server from the leader's own socket: a peer silent for 20 s is probed
    # every 10 s, and dropped (with its advisory lock) after 3 unanswered probes.
    assert leader.keepalives == {"tcp_keepalives_idle": "20", "tcp_keepalives_interval": "10",
                                 "tcp_keepalives_count": "3", "tcp_user_timeout": "50000"}


def test_leader_prunes_expired_idempotency_keys_and_keeps_live_ones(
    pool: ConnectionPool[DictConnection], caller: Caller, leader: MaintenanceLeader,
) -> None:
    old = enqueue(pool, caller, "old", idempotency_key="old-key")
    enqueue(pool, caller, "new", idempotency_key="new-key")
    with pool.connection() as conn:
        conn.execute("UPDATE sa_idempotency_key SET created_at = now() - interval '2 days' "
                     "WHERE key = 'old-key'")
    rounds = leader.retention_rounds

    wait_for(lambda: leader.retention_rounds > rounds + 1)

    assert [r["key"] for r in fetch_all(pool, "SELECT key FROM sa_idempotency_key")] == ["new-key"]
    # Retention never touches a job that is not old enough, nor a queued one.
    assert fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", old.job_id)["state"] == "queued"


def test_retention_archives_old_finished_jobs_in_bounded_rounds(
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    finished = sorted(finished_job(pool, caller, f"done {i}") for i in range(3))
    queued = enqueue(pool, caller, "still queued").job_id
    later = fetch_one(pool, "SELECT now() + interval '2 days' AS t")["t"]
    retention = Retention(Retention.Config(archive_after=DAY, idempotency_key_retention=0,
                                           archive_batch_size=1, archive_max_batches=1))

    assert retention.run_once(pool, now=later - timedelta(days=1, seconds=1)) == RetentionCounts()
    # One job scanned per batch, one batch per round: each round goes on where the last stopped.
    rounds = [retention.run_once(pool, now=later) for _ in range(5)]

    assert [(r.archived_jobs, r.more) for r in rounds] == [
        (1, True), (1, True), (1, True), (0, True), (0, False)]
    archived = sorted(r["id"] for r in fetch_all(pool, "SELECT id FROM sa_job_archive"))
    assert archived == finished
    assert [r["id"] for r in fetch_all(pool, "SELECT id FROM sa_job")] == [queued]


