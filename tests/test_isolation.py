"""One bad row never stops the others: a job no statement can write (here a test-only trigger raises
for it) is quarantined, while the rest of its finalize batch, its heartbeat, its reclaim page, its
archive run and other orgs' jobs go through, and an operator's cancel-job still works."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.attempt import CallRecord
from jobqueue.core.console import BulkAction
from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import Caller
from jobqueue.engine import finalize
from jobqueue.engine.bulk import run_bulk
from jobqueue.engine.claim import ClaimedJob, claim
from jobqueue.engine.enqueue import enqueue
from jobqueue.engine.heartbeat import heartbeat, release
from jobqueue.engine.reclaim import ReclaimCounts, Reclaimer
from jobqueue.runtime.archive import Archiver
from jobqueue.runtime.maintenance import MaintenanceLeader
from tests.helpers import WorkerHarness, fetch_all, fetch_one, wait_for

RECLAIM = Reclaimer.Config(stale_after=1.0, stuck_after=5.0, batch_size=100)
OTHER = Caller(org_id=2, user_id=20)

_POISON = """
CREATE TABLE test_poisoned (id uuid PRIMARY KEY);
CREATE FUNCTION test_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM test_poisoned WHERE id = OLD.id) THEN
        RAISE EXCEPTION 'job % cannot be written (test poison)', OLD.id;
    END IF;
    RETURN coalesce(NEW, OLD);
END;
$$;
CREATE TRIGGER test_poison BEFORE UPDATE OR DELETE ON sa_job
    FOR EACH ROW EXECUTE FUNCTION test_poison();
"""


@pytest.fixture
def poison(pool: ConnectionPool[DictConnection]) -> Iterator[Callable[[uuid.UUID], None]]:
    """Makes every UPDATE or DELETE of the jobs it is given fail in the database."""
    with pool.connection() as conn:
        conn.execute(_POISON)

    def add(job_id: uuid.UUID) -> None:
        with pool.connection() as conn:
            conn.execute("INSERT INTO test_poisoned (id) VALUES (%s)", (job_id,))

    yield add
    with pool.connection() as conn:
        conn.execute("DROP TRIGGER test_poison ON sa_job; DROP FUNCTION test_poison(); "
                     "DROP TABLE test_poisoned; DELETE FROM sa_job_quarantine")


def claimed(pool: ConnectionPool[DictConnection], callers: list[Caller], claim_id: str
            ) -> list[ClaimedJob]:
    for n, who in enumerate(callers):
        enqueue(pool, who, f"job {n} of org {who.org_id}")
    jobs = claim(pool, claim_id, len(callers), 100)
    assert len(jobs) == len(callers)
    return jobs


def quarantined(pool: ConnectionPool[DictConnection]) -> dict[uuid.UUID, str]:
    return {r["job_id"]: r["operation"]
            for r in fetch_all(pool, "SELECT job_id, operation FROM sa_job_quarantine")}


def test_a_finalize_batch_writes_every_job_but_the_one_that_cannot_be_written(
    pool: ConnectionPool[DictConnection], caller: Caller, poison: Callable[[uuid.UUID], None],
) -> None:
    jobs = claimed(pool, [caller, caller, OTHER, OTHER], "w1")
    bad = jobs[1]
    poison(bad.id)
    call = CallRecord(model="m", latency_ms=5, http_status=200)
    results = finalize.write(pool, [finalize.succeeded(job, f"answer {n}", call)
                                     for n, job in enumerate(jobs)])

    assert results == [job is not bad for job in jobs]
    states = {r["id"]: r["state"] for r in fetch_all(pool, "SELECT id, state FROM sa_job")}
    assert states == {job.id: "running" if job is bad else "succeeded" for job in jobs}
    assert quarantined(pool) == {bad.id: "finalize"}
    error = fetch_one(pool, "SELECT error FROM sa_job_quarantine")["error"]
    assert "cannot be written (test poison)" in error

    # NOTE: the job's heartbeat fails alone: the worker's other jobs keep theirs.
    others = claimed(pool, [OTHER], "w1")
    assert heartbeat(pool, "w1", {bad.id: bad.org_id, others[0].id: OTHER.org_id}) == {
        (others[0].id, 1)}


def test_reclaim_rounds_go_past_a_job_they_cannot_write_and_the_leader_keeps_reclaiming(
    pool: ConnectionPool[DictConnection], caller: Caller, poison: Callable[[uuid.UUID], None],
    database_url: str,
) -> None:
    bad, theirs = claimed(pool, [caller, OTHER], "dead-worker")
    poison(bad.id)
    later = theirs.claimed_at + timedelta(seconds=2)
    reclaimer = Reclaimer(pool, RECLAIM)

    assert reclaimer.run_once(now=later) == ReclaimCounts(requeued=1)
    assert fetch_one(pool, "SELECT state, error_kind FROM sa_job WHERE id = %s", theirs.id) == {
        "state": "queued", "error_kind": "worker_crash"}
    assert quarantined(pool) == {bad.id: "reclaim"}
    # NOTE: a quarantined job is no longer read, so the next rounds do not meet it again.
    assert reclaimer.run_once(now=later) == ReclaimCounts()

    # NOTE: the elected leader reclaims another org's job of a worker that died after it.
    (lost,) = claimed(pool, [OTHER], "another-dead-worker")
    leader = MaintenanceLeader(database_url, RECLAIM, MaintenanceLeader.Config(
        reclaim_interval=0.1, lock_retry_interval=0.05, reconnect_delay=0.1)).start()
    try:
        wait_for(lambda: fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s",
                                   lost.id)["state"] == "queued", timeout=15)
        assert leader.errors == 0
    finally:
        leader.stop()


def test_a_worker_goes_on_past_a_job_it_cannot_finalize_and_cancel_job_still_works(
    pool: ConnectionPool[DictConnection], caller: Caller, poison: Callable[[uuid.UUID], None],
    workers: WorkerHarness, cli: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str],
) -> None:
    slow = enqueue(pool, caller, "slow [fake:latency=1]")
    waiting = enqueue(pool, OTHER, "not yet", delay_seconds=3600)
    workers.start()
    wait_for(lambda: fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s",
                               slow.job_id)["state"] == "running")
    poison(slow.job_id)
    done = [enqueue(pool, who, f"after the bad one {n}") for n, who in enumerate([caller, OTHER] * 3)]
    # NOTE: its heartbeat or its finalize, whichever comes first, meets the failure.
    wait_for(lambda: set(quarantined(pool)) == {slow.job_id})
    wait_for(lambda: {r["state"] for r in fetch_all(
        pool, "SELECT state FROM sa_job WHERE id = ANY(%s)", [d.job_id for d in done])} ==
        {"succeeded"})

    assert cli(["cancel-job", str(waiting.job_id)]) == 0
    assert fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s",
                     waiting.job_id)["state"] == "cancelled"
    capsys.readouterr()
    # NOTE: the job no write reaches answers in one line, not a traceback.
    assert cli(["cancel-job", str(slow.job_id)]) == 1
    err = capsys.readouterr().err
    assert "cannot be written (test poison)" in err and "Traceback" not in err


def test_a_queued_job_no_claim_can_write_is_set_aside_and_the_others_run(
    pool: ConnectionPool[DictConnection], caller: Caller, poison: Callable[[uuid.UUID], None],
    workers: WorkerHarness,
) -> None:
    bad = enqueue(pool, caller, "never claimed")
    poison(bad.job_id)
    good = [enqueue(pool, who, f"claimed {n}") for n, who in enumerate([caller, OTHER] * 2)]
    worker = workers.start()
    wait_for(lambda: {r["state"] for r in fetch_all(
        pool, "SELECT state FROM sa_job WHERE id = ANY(%s)", [g.job_id for g in good])} ==
        {"succeeded"})
    assert quarantined(pool) == {bad.job_id: "claim"}
    assert fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", bad.job_id)["state"] == "queued"
    assert worker.claim_failures == 0


def test_a_shutdown_releases_every_job_but_the_one_it_cannot_write(
    pool: ConnectionPool[DictConnection], caller: Caller, poison: Callable[[uuid.UUID], None],
) -> None:
    jobs = claimed(pool, [caller, OTHER, OTHER], "stopping")
    poison(jobs[0].id)
    assert release(pool, "stopping") == 2
    assert quarantined(pool) == {jobs[0].id: "release"}
    rows = fetch_all(pool, "SELECT id, state FROM sa_job WHERE id = ANY(%s)", [j.id for j in jobs])
    assert {r["id"]: r["state"] for r in rows} == {
        jobs[0].id: "running", jobs[1].id: "queued", jobs[2].id: "queued"}


def test_an_archive_run_moves_every_family_but_the_one_it_cannot_move(
    pool: ConnectionPool[DictConnection], caller: Caller, poison: Callable[[uuid.UUID], None],
) -> None:
    jobs = claimed(pool, [caller, caller, OTHER, OTHER], "w1")
    call = CallRecord(model="m", latency_ms=5, http_status=200)
    finalize.write(pool, [finalize.succeeded(job, "answer", call) for job in jobs])
    stuck = jobs[2].id
    poison(stuck)
    cutoff = fetch_one(pool, "SELECT now() + interval '1 minute' AS t")["t"]
    moved = Archiver(pool, Archiver.Config(batch_size=100, statement_timeout=5.0)).run_once(cutoff)
    assert moved.jobs == 3
    assert [r["id"] for r in fetch_all(pool, "SELECT id FROM sa_job")] == [stuck]
    assert {r["id"] for r in fetch_all(pool, "SELECT id FROM sa_job_archive")} == {
        job.id for job in jobs} - {stuck}
    # NOTE: the family left behind moves on a later run once its cause is mended.
    with pool.connection() as conn:
        conn.execute("DELETE FROM test_poisoned")
    assert Archiver(pool).run_once(cutoff).jobs == 1


def test_a_chain_that_cannot_be_settled_never_holds_back_another_orgs_chain(
    pool: ConnectionPool[DictConnection], caller: Caller, poison: Callable[[uuid.UUID], None],
) -> None:
    roots = claimed(pool, [caller, OTHER], "w1")
    ours = [enqueue(pool, caller, f"after ours {n}", after=roots[0].id).job_id for n in range(2)]
    theirs = [enqueue(pool, OTHER, f"after theirs {n}", after=roots[1].id).job_id for n in range(2)]
    poison(ours[1])
    call = CallRecord(model="m", latency_ms=5, http_status=200)
    finalize.write(pool, [finalize.succeeded(job, "answer", call) for job in roots])
    waiting = {r["id"]: r["waiting"] for r in fetch_all(pool, "SELECT id, waiting FROM sa_job")}
    assert [waiting[j] for j in theirs] == [False, False]
    # NOTE: our chain is settled as one statement: it waits, whole, until its cause is mended.
    assert [waiting[j] for j in ours] == [True, True]


def test_an_operators_bulk_cancel_changes_every_job_but_the_one_it_cannot_write(
    pool: ConnectionPool[DictConnection], caller: Caller, poison: Callable[[uuid.UUID], None],
) -> None:
    jobs = [enqueue(pool, caller, f"bulk {n}").job_id for n in range(5)]
    poison(jobs[2])
    operator = Caller(org_id=9, user_id=90, scopes=frozenset({"ops"}))
    done = run_bulk(pool, BulkAction.CANCEL, operator, ids=jobs, max_jobs=5, batch_size=5)
    assert sorted(done.job_ids) == sorted(jobs[:2] + jobs[3:]) and done.batches == 1
    states = {r["id"]: r["state"] for r in fetch_all(pool, "SELECT id, state FROM sa_job")}
    assert states == {**{j: "cancelled" for j in jobs}, jobs[2]: "queued"}
