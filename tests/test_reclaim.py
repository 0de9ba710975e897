"""Failure model, part 1: heartbeat-based reclaim, stuck jobs, and the elected maintenance leader."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import maintenance as mq
from jobqueue.core.tokens import Caller
from jobqueue.engine.claim import ClaimedJob, claim
from jobqueue.engine.enqueue import enqueue
from jobqueue.engine.reclaim import ReclaimCounts, Reclaimer
from jobqueue.runtime.maintenance import MaintenanceLeader
from tests.helpers import WorkerHarness, fetch_all, fetch_one, wait_for

REPO = Path(__file__).resolve().parent.parent
CONFIG = Reclaimer.Config(stale_after=1.0, stuck_after=5.0, batch_size=100)
FAST = MaintenanceLeader.Config(reclaim_interval=0.1, lock_retry_interval=0.05,
                                reconnect_delay=0.1, connect_timeout=5.0)
HOLDERS = """
SELECT a.pid, a.application_name
  FROM pg_locks l JOIN pg_stat_activity a USING (pid)
 WHERE l.locktype = 'advisory' AND l.granted AND l.database =
       (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def job_row(pool: ConnectionPool[DictConnection], job_id: Any) -> dict[str, Any]:
    return fetch_one(pool, "SELECT * FROM sa_job WHERE id = %s", job_id)


def dead_claim(pool: ConnectionPool[DictConnection], caller: Caller, text: str = "lost",
               max_attempts: int = 3) -> ClaimedJob:
    """Enqueues a job and claims it for a worker that never heartbeats (it 'died')."""
    enqueue(pool, caller, text, max_attempts=max_attempts)
    (job,) = claim(pool, "dead-worker", 1, 100)
    return job


def transitions(pool: ConnectionPool[DictConnection], job_id: Any) -> list[tuple[Any, ...]]:
    rows = fetch_all(pool, "SELECT from_state, to_state, attempt, error_kind FROM sa_job_event "
                           "WHERE job_id = %s ORDER BY id", job_id)
    return [(r["from_state"], r["to_state"], r["attempt"], r["error_kind"]) for r in rows]


@pytest.fixture
def leaders(database_url: str) -> Iterator[Callable[..., MaintenanceLeader]]:
    started: list[MaintenanceLeader] = []

    def start(reclaim: Reclaimer.Config = CONFIG, config: MaintenanceLeader.Config = FAST,
              **kwargs: Any) -> MaintenanceLeader:
        leader = MaintenanceLeader(database_url, reclaim, config, **kwargs).start()
        started.append(leader)
        return leader

    yield start
    for leader in started:
        leader.stop()


def test_dead_workers_job_is_requeued_then_completes_on_a_real_worker(
    pool: ConnectionPool[DictConnection], caller: Caller, workers: WorkerHarness,
) -> None:
    job = dead_claim(pool, caller, "what is a heartbeat?")
    reclaimer = Reclaimer(pool, CONFIG)

    # Just before the heartbeat goes stale nothing happens; just after, the job is requeued.
    assert reclaimer.run_once(now=job.claimed_at + timedelta(seconds=0.9)) == ReclaimCounts()
    assert job_row(pool, job.id)["state"] == "running"
    counts = reclaimer.run_once(now=job.claimed_at + timedelta(seconds=1.5))

    assert counts == ReclaimCounts(requeued=1, failed=0)
    row = job_row(pool, job.id)
    assert (row["state"], row["attempt"], row["error_kind"]) == ("queued", 2, "worker_crash")
    assert row["worker_claim"] is None and row["running_heartbeat_at"] is None
    assert row["finished_at"] is None
    assert "dead-worker" in row["error_message"] and "no heartbeat since" in row["error_message"]
    assert transitions(pool, job.id)[-1] == ("running", "queued", 2, "worker_crash")

    workers.build().run(once=True)

    row = job_row(pool, job.id)
    assert (row["state"], row["attempt"], row["error_kind"]) == ("succeeded", 2, None)
    assert fetch_one(pool, "SELECT content FROM sa_entity WHERE id = %s", row["response_id"])[
        "content"] == "echo[1]: user:what is a heartbeat?"
    ledger = fetch_all(pool, "SELECT attempt, outcome FROM sa_ledger WHERE job_id = %s", job.id)
    assert [(r["attempt"], r["outcome"]) for r in ledger] == [(2, "succeeded")]


def test_job_with_a_fresh_heartbeat_is_left_alone(
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    job = dead_claim(pool, caller)

    assert Reclaimer(pool, CONFIG).run_once() == ReclaimCounts()

    row = job_row(pool, job.id)
    assert (row["state"], row["attempt"], row["worker_claim"]) == ("running", 1, "dead-worker")


def test_live_workers_heartbeat_keeps_a_long_call_from_being_reclaimed(
    pool: ConnectionPool[DictConnection], caller: Caller, workers: WorkerHarness,
) -> None:
    workers.start(heartbeat_interval=0.1)
    done = enqueue(pool, caller, "slow [fake:latency=1.5]")
    stale_after = 0.5
    reclaimer = Reclaimer(pool, Reclaimer.Config(stale_after=stale_after, stuck_after=60.0))

    # Wait until the call has outlived `stale_after` while the heartbeat kept up with it.
    wait_for(lambda: fetch_one(
        pool, "SELECT state = 'running' AND running_heartbeat_at > claimed_at "
              "+ make_interval(secs => %s) AS ok FROM sa_job WHERE id = %s",
        stale_after + 0.2, done.job_id)["ok"])
    assert reclaimer.run_once() == ReclaimCounts()

    wait_for(lambda: job_row(pool, done.job_id)["state"] == "succeeded")
    assert job_row(pool, done.job_id)["attempt"] == 1


def test_reclaim_fails_the_job_as_stuck_once_attempts_are_exhausted(
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    reclaimer = Reclaimer(pool, CONFIG)
    first = dead_claim(pool, caller, max_attempts=2)
    assert reclaimer.run_once(now=first.claimed_at + timedelta(seconds=2)).requeued == 1
    (second,) = claim(pool, "dead-worker-2", 1, 100)
    assert (second.id, second.attempt) == (first.id, 2)

    counts = reclaimer.run_once(now=second.claimed_at + timedelta(seconds=2))

    assert counts == ReclaimCounts(requeued=0, failed=1)
    row = job_row(pool, first.id)
    assert (row["state"], row["attempt"], row["error_kind"]) == ("failed", 2, "stuck")
    assert row["finished_at"] is not None
    assert "dead-worker-2" in row["error_message"] and "last attempt" in row["error_message"]
    assert [t[:3] for t in transitions(pool, first.id)] == [
        (None, "queued", 1), ("queued", "running", 1), ("running", "queued", 2),
        ("queued", "running", 2), ("running", "failed", 2)]


def test_reclaim_fails_an_attempt_older_than_stuck_after_even_with_attempts_left(
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    job = dead_claim(pool, caller, max_attempts=3)

    counts = Reclaimer(pool, CONFIG).run_once(now=job.claimed_at + timedelta(seconds=6))

    assert counts == ReclaimCounts(requeued=0, failed=1)
    row = job_row(pool, job.id)
    assert (row["state"], row["attempt"], row["error_kind"]) == ("failed", 1, "stuck")
    assert "longer ago than the stuck limit" in row["error_message"]


def test_reclaim_pages_through_many_jobs_in_batches(
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    for i in range(7):
        enqueue(pool, caller, f"job {i}", max_attempts=1 if i < 2 else 3)
    claimed = claim(pool, "dead-worker", 10, 100)
    assert len(claimed) == 7
    later = max(j.claimed_at for j in claimed) + timedelta(seconds=2)

    counts = Reclaimer(pool, Reclaimer.Config(stale_after=1.0, stuck_after=5.0, batch_size=2)
                       ).run_once(now=later)

    assert counts == ReclaimCounts(requeued=5, failed=2)
    states = fetch_all(pool, "SELECT state, count(*) AS n FROM sa_job GROUP BY state ORDER BY state")
    assert [(r["state"], r["n"]) for r in states] == [("failed", 2), ("queued", 5)]


def test_reclaim_statement_is_served_by_the_heartbeat_index(
    pool: ConnectionPool[DictConnection], truncated_tables: None,
) -> None:
    params = {"now": None, "stale_after": 1.0, "stuck_after": 5.0, "limit": 10,
              "after_heartbeat": None, "after_id": None}
    with pool.connection() as conn, conn.transaction():
        # NOTE: an empty table makes a sequential scan cheapest; forbid it to see the path.
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r["QUERY PLAN"] for r in conn.execute(
            "EXPLAIN " + mq.JOB_LIST_RECLAIMABLE_PAGE, params).fetchall())
    assert "sa_job_heartbeat_idx" in plan, plan


def test_each_reclaim_statement_runs_under_a_statement_timeout(
    pool: ConnectionPool[DictConnection], database_url: str,
) -> None:
    reclaimer = Reclaimer(pool, Reclaimer.Config(statement_timeout=0.2))
    with psycopg.connect(database_url) as blocker:
        blocker.execute("LOCK TABLE sa_job IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(psycopg.errors.QueryCanceled):
            reclaimer.run_once()
    assert reclaimer.run_once() == ReclaimCounts()


def test_cli_reclaim_stuck_jobs(
    cli: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str],
    pool: ConnectionPool[DictConnection], caller: Caller, monkeypatch: pytest.MonkeyPatch,
) -> None:
    job = dead_claim(pool, caller)
    with pool.connection() as conn:
        conn.execute("UPDATE sa_job SET running_heartbeat_at = now() - interval '1 hour' "
                     "WHERE id = %s", (job.id,))
    monkeypatch.setenv("SA_STALE_AFTER", "60")

    assert cli(["reclaim-stuck-jobs"]) == 0

    assert "requeued 1 job(s), failed 0 as stuck" in capsys.readouterr().out
    assert job_row(pool, job.id)["state"] == "queued"


def test_exactly_one_leader_and_the_role_moves_when_the_holder_stops(
    pool: ConnectionPool[DictConnection], caller: Caller,
    leaders: Callable[..., MaintenanceLeader],
) -> None:
    rounds: list[ReclaimCounts] = []
    a, b = leaders(on_round=rounds.append), leaders(on_round=rounds.append)
    holder = wait_for(lambda: a if a.is_leader else b if b.is_leader else None)
    other = b if holder is a else a
    tried = other.lock_attempts
    wait_for(lambda: other.lock_attempts >= tried + 3 and holder.rounds >= 3)
    assert holder.is_leader and not other.is_leader and holder.terms == 1 and other.terms == 0
    assert len(fetch_all(pool, HOLDERS)) == 1

    job = dead_claim(pool, caller)
    with pool.connection() as conn:
        conn.execute("UPDATE sa_job SET running_heartbeat_at = now() - interval '1 minute' "
                     "WHERE id = %s", (job.id,))
    holder.stop()

    assert other.became_leader.wait(10)
    assert not holder.is_leader and len(fetch_all(pool, HOLDERS)) == 1
    wait_for(lambda: job_row(pool, job.id)["state"] == "queued")
    row = job_row(pool, job.id)
    assert (row["attempt"], row["error_kind"]) == (2, "worker_crash")
    wait_for(lambda: other.last_counts is not None and other.rounds >= 1)
    assert sum(c.requeued for c in rounds) == 1


def test_a_killed_leader_process_hands_the_role_over(
    pool: ConnectionPool[DictConnection], caller: Caller, database_url: str,
    leaders: Callable[..., MaintenanceLeader],
) -> None:
    script = textwrap.dedent("""
        import sys, threading
        from jobqueue.runtime.maintenance import MaintenanceLeader
        from jobqueue.engine.reclaim import Reclaimer
        config = MaintenanceLeader.Config(reclaim_interval=0.1, lock_retry_interval=0.05)
        MaintenanceLeader(sys.argv[1], Reclaimer.Config(), config).start()
        threading.Event().wait()
    """)
    child = subprocess.Popen([sys.executable, "-c", script, database_url], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: fetch_all(pool, HOLDERS), timeout=30)
        follower = leaders()
        wait_for(lambda: follower.lock_attempts >= 3)
        assert not follower.is_leader

        job = dead_claim(pool, caller)
        with pool.connection() as conn:
            conn.execute("UPDATE sa_job SET running_heartbeat_at = now() - interval '1 minute' "
                         "WHERE id = %s", (job.id,))
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)

        assert follower.became_leader.wait(10)
        wait_for(lambda: job_row(pool, job.id)["state"] == "queued")
        assert job_row(pool, job.id)["error_kind"] == "worker_crash"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def test_leader_reconnects_and_competes_again_when_its_connection_is_cut(
    pool: ConnectionPool[DictConnection], leaders: Callable[..., MaintenanceLeader],
) -> None:
    leader = leaders()
    assert leader.became_leader.wait(10)
    (row,) = fetch_all(pool, HOLDERS)
    assert row["application_name"] == "sa-core maintenance"

    with pool.connection() as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (row["pid"],))

    wait_for(lambda: leader.terms == 2 and leader.is_leader)
    assert leader.errors >= 1
    rounds = leader.rounds
    wait_for(lambda: leader.rounds > rounds)
    (new_row,) = fetch_all(pool, HOLDERS)
    assert new_row["pid"] != row["pid"]


def test_leader_keeps_its_role_and_runs_again_after_a_failed_round(
    database_url: str, leaders: Callable[..., MaintenanceLeader],
) -> None:
    leader = leaders(reclaim=Reclaimer.Config(stale_after=1.0, statement_timeout=0.1))
    wait_for(lambda: leader.rounds >= 1)
    with psycopg.connect(database_url) as blocker:
        blocker.execute("LOCK TABLE sa_job IN ACCESS EXCLUSIVE MODE")
        wait_for(lambda: leader.errors >= 2)
        assert leader.is_leader and leader.terms == 1
        rounds = leader.rounds
    wait_for(lambda: leader.rounds > rounds)
    assert leader.is_leader and leader.terms == 1


def test_stop_releases_the_lock_and_closes_the_connection(
    pool: ConnectionPool[DictConnection], leaders: Callable[..., MaintenanceLeader],
) -> None:
    leader = leaders()
    assert leader.became_leader.wait(10)

    leader.stop()

    assert not leader.is_leader and not leader.became_leader.is_set()
    assert fetch_all(pool, HOLDERS) == []
    # NOTE: the server ends the backend just after the client closed its socket.
    wait_for(lambda: fetch_all(pool, "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                                     "AND datname = current_database()", "sa-core maintenance") == [])


def test_an_attempt_past_stuck_after_fails_as_stuck_although_its_worker_heartbeats(
    pool: ConnectionPool[DictConnection], caller: Caller, workers: WorkerHarness,
    leaders: Callable[..., MaintenanceLeader],
) -> None:
    # One job slot, a provider call that outlasts the stuck limit four times over (it answers
    # 200 after 2 s), a fresh heartbeat every 0.1 s: only the stuck limit can free the job.
    workers.start(concurrency=1, heartbeat_interval=0.1)
    slow = enqueue(pool, caller, "answered too late [fake:latency=2]")
    wait_for(lambda: job_row(pool, slow.job_id)["state"] == "running")
    leaders(Reclaimer.Config(stale_after=30.0, stuck_after=0.5))

    wait_for(lambda: job_row(pool, slow.job_id)["state"] == "failed")
    row = job_row(pool, slow.job_id)
    assert (row["error_kind"], row["attempt"]) == ("stuck", 1)
    assert "still heartbeating" in row["error_message"]
    assert transitions(pool, slow.job_id)[-1] == ("running", "failed", 1, "stuck")

    # The slot comes back at once: the next job runs on the same one-slot worker.
    after = enqueue(pool, caller, "next in line")
    wait_for(lambda: job_row(pool, after.job_id)["state"] == "succeeded")

    # NOTE: the late answer has no event of its own to wait on; wait until it is well past
    # (the database's clock), then check that its finalize wrote nothing.
    wait_for(lambda: fetch_one(pool, "SELECT now() > started_at + interval '3 s' AS past "
                                     "FROM sa_job WHERE id = %s", slow.job_id)["past"])
    row = job_row(pool, slow.job_id)
    assert (row["state"], row["error_kind"], row["response_id"]) == ("failed", "stuck", None)
    assert not fetch_all(pool, "SELECT 1 FROM sa_ledger WHERE job_id = %s", slow.job_id)
    assert not fetch_all(pool, "SELECT 1 FROM sa_entity WHERE kind = 'response' AND parent_id = %s",
                         slow.prompt_id)
