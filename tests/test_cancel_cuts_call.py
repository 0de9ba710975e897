"""Cancel stops the call (issue 22, item 4): whatever takes a running job from its worker, the
worker closes the provider connection within a second, frees the slot and writes nothing.

The provider here (tests/holding_provider.py) holds `[hold]` calls open and notes when the
worker hung up. Workers run with the default SA_HEARTBEAT_INTERVAL (30 s), so only the
departure watch (jobqueue/engine/departures.py) can be that fast.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import falcon.testing
import psycopg
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.routes import Route
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import Caller
from jobqueue.engine.claim import claim
from jobqueue.engine.departures import DepartureWatch
from jobqueue.engine.enqueue import enqueue
from jobqueue.runtime.worker import Worker
from tests.helpers import REPO, WorkerHarness, fetch_one, find_psql, require, submit, wait_for
from tests.holding_provider import Held, HoldingProvider
from tests.processes import log_lines, run_process

API = "/sa-core/v1"
# NOTE: the bound the issue sets, from the cancel's commit to the provider seeing the close.
CUT_WITHIN = 1.0


@pytest.fixture(scope="module")
def holding() -> Iterator[HoldingProvider]:
    provider = HoldingProvider()
    yield provider
    provider.stop()


@pytest.fixture
def settings(base_settings: Settings, holding: HoldingProvider) -> Settings:
    """The tests' settings with SA_HEARTBEAT_INTERVAL at its default and this provider."""
    return replace(base_settings, provider_url=holding.url, heartbeat_interval=30.0)


def _hold(client: falcon.testing.TestClient, auth: dict[str, str], holding: HoldingProvider,
          pool: ConnectionPool[DictConnection]) -> tuple[str, Held]:
    """Submits a call the provider holds; returns its job once running, and the held call."""
    marker = f"[hold] {uuid.uuid4()}"
    job_id = submit(client, auth, text=marker)["job_id"]
    held = holding.held(marker)
    wait_for(lambda: _job(pool, job_id)["state"] == "running")
    return job_id, held


def _job(pool: ConnectionPool[DictConnection], job_id: object) -> dict[str, object]:
    return fetch_one(pool, "SELECT state, response_id, attempt, "
                           "(SELECT count(*) FROM sa_ledger l WHERE l.job_id = j.id) AS ledger "
                           "FROM sa_job j WHERE id = %s", job_id)


def _assert_cut(held: Held, cancelled_at: float) -> None:
    """The provider saw the connection closed within CUT_WITHIN of the cancel."""
    assert held.closed.wait(5), "the worker never closed the provider connection"
    assert held.closed_at is not None
    assert held.closed_at - cancelled_at < CUT_WITHIN, (
        f"closed {held.closed_at - cancelled_at:.2f}s after the cancel")


def _assert_slot_free_and_nothing_written(
    client: falcon.testing.TestClient, auth: dict[str, str], worker: Worker,
    pool: ConnectionPool[DictConnection], job_id: str, state: str = "cancelled",
) -> None:
    wait_for(lambda: worker.inflight == 0, timeout=2)
    follower = submit(client, auth, text="next in line")["job_id"]
    wait_for(lambda: _job(pool, follower)["state"] == "succeeded", timeout=3)
    assert _job(pool, job_id) == {"state": state, "response_id": None, "attempt": 1, "ledger": 0}


def _claim_lost_lines(capfd: pytest.CaptureFixture[str], job_id: str) -> list[str]:
    return [line for line in capfd.readouterr().err.splitlines()
            if job_id in line and ('"job.claim_lost"' in line or '"job.abandoned"' in line)]


@pytest.mark.parametrize("listen", [True, False], ids=["listen", "SA_LISTEN=0"])
def test_a_cancel_through_the_api_closes_a_non_streamed_call_within_a_second(
    listen: bool, client: falcon.testing.TestClient, auth: dict[str, str],
    workers: WorkerHarness, holding: HoldingProvider, pool: ConnectionPool[DictConnection],
    capfd: pytest.CaptureFixture[str],
) -> None:
    worker = workers.start(listen=listen, concurrency=1)
    job_id, held = _hold(client, auth, holding, pool)

    answer = client.simulate_post(f"{API}/jobs/{job_id}/cancel", headers=auth)
    cancelled_at = time.monotonic()

    assert answer.status_code == 200, answer.text
    _assert_cut(held, cancelled_at)
    _assert_slot_free_and_nothing_written(client, auth, worker, pool, job_id)
    assert len(_claim_lost_lines(capfd, job_id)) == 1


def test_sa_core_cancel_job_closes_the_call(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    holding: HoldingProvider, pool: ConnectionPool[DictConnection],
    cli: Callable[[list[str]], int],
) -> None:
    worker = workers.start(concurrency=1)
    job_id, held = _hold(client, auth, holding, pool)

    assert cli(["cancel-job", job_id]) == 0
    cancelled_at = time.monotonic()

    _assert_cut(held, cancelled_at)
    _assert_slot_free_and_nothing_written(client, auth, worker, pool, job_id)


def test_the_psql_cancel_script_closes_the_call(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    holding: HoldingProvider, pool: ConnectionPool[DictConnection], database_url: str,
) -> None:
    psql = find_psql()
    require(None if psql else "no `psql`", "apt-get install postgresql-client")
    assert psql is not None
    worker = workers.start(concurrency=1)
    job_id, held = _hold(client, auth, holding, pool)

    done = subprocess.run([psql, "-X", "-d", database_url, "-v", f"job_id={job_id}", "-f",
                           str(REPO / "jobqueue" / "sql" / "ops" / "cancel_job.sql")],
                          capture_output=True, text=True, timeout=30, check=False)
    cancelled_at = time.monotonic()

    assert done.returncode == 0, done.stderr
    _assert_cut(held, cancelled_at)
    _assert_slot_free_and_nothing_written(client, auth, worker, pool, job_id)


def test_a_hand_typed_update_closes_the_call(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    holding: HoldingProvider, pool: ConnectionPool[DictConnection],
) -> None:
    worker = workers.start(concurrency=1)
    job_id, held = _hold(client, auth, holding, pool)

    with pool.connection() as conn:
        conn.execute("UPDATE sa_job SET state = 'cancelled', finished_at = now() WHERE id = %s",
                     (job_id,))
    cancelled_at = time.monotonic()

    _assert_cut(held, cancelled_at)
    _assert_slot_free_and_nothing_written(client, auth, worker, pool, job_id)


def test_a_cancel_committed_after_a_later_event_is_still_seen(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    holding: HoldingProvider, pool: ConnectionPool[DictConnection], database_url: str,
) -> None:
    # The cancel takes its event id first but commits after a later id was read: a cursor at
    # "the largest id seen" would skip it for good.
    worker = workers.start(concurrency=1)
    job_id, held = _hold(client, auth, holding, pool)
    # NOTE: a connection of its own: a pooled one left out of autocommit would reach later tests.
    with psycopg.connect(database_url) as late:
        late.execute("UPDATE sa_job SET state = 'cancelled', finished_at = now() WHERE id = %s",
                     (job_id,))
        submit(client, auth, text=f"a later event {uuid.uuid4()}")
        looks = worker.departure_looks
        wait_for(lambda: worker.departure_looks >= looks + 3)
        late.commit()
    cancelled_at = time.monotonic()

    _assert_cut(held, cancelled_at)
    _assert_slot_free_and_nothing_written(client, auth, worker, pool, job_id)


def test_a_reclaim_closes_the_call_of_the_worker_it_took_the_job_from(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    holding: HoldingProvider, pool: ConnectionPool[DictConnection],
    cli: Callable[[list[str]], int], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # NOTE: a heartbeat every 30 s leaves the job stale after SA_STALE_AFTER (1 s here).
    monkeypatch.setenv("SA_STALE_AFTER", "1")
    workers.start(concurrency=1)
    job_id, held = _hold(client, auth, holding, pool)
    wait_for(lambda: fetch_one(pool, "SELECT running_heartbeat_at < now() - interval '1.2 s' "
                                     "AS stale FROM sa_job WHERE id = %s", job_id)["stale"])

    assert cli(["reclaim-stuck-jobs"]) == 0
    reclaimed_at = time.monotonic()

    _assert_cut(held, reclaimed_at)
    # NOTE: the job is back in the queue with its next attempt, which this worker may take.
    assert fetch_one(pool, "SELECT attempt FROM sa_job WHERE id = %s", job_id)["attempt"] == 2


def test_a_cancel_closes_a_streamed_call_between_its_chunks(
    client: falcon.testing.TestClient, auth: dict[str, str], settings: Settings,
    holding: HoldingProvider, pool: ConnectionPool[DictConnection],
) -> None:
    # The stream sends nothing after its first chunk, so no write of the worker finds the job
    # gone: only the watch can cut it.
    streamed = replace(settings, provider_url="",
                       provider_routes=(Route("streamed", holding.url, stream=True),))
    harness = WorkerHarness(streamed, pool)
    try:
        worker = harness.start(concurrency=1)
        job_id, held = _hold(client, auth, holding, pool)
        assert held.streamed
        wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM sa_job_delta "
                                         "WHERE job_id = %s", job_id)["n"] == 1)

        assert client.simulate_post(f"{API}/jobs/{job_id}/cancel", headers=auth).status_code == 200
        cancelled_at = time.monotonic()

        _assert_cut(held, cancelled_at)
        _assert_slot_free_and_nothing_written(client, auth, worker, pool, job_id)
    finally:
        harness.stop_all()


def test_a_gevent_worker_process_without_listen_closes_the_call(
    settings: Settings, holding: HoldingProvider, pool: ConnectionPool[DictConnection],
    caller: Caller, tmp_path: Path,
) -> None:
    # `sa-core run-worker` as deployed: monkey-patched by gevent, SA_LISTEN=0 (PgBouncer in
    # transaction mode), the default heartbeat; the cancel is plain SQL.
    env = {"DATABASE_URL": settings.database_url, "SA_PROVIDER_URL": holding.url,
           "SA_LISTEN": "0", "SA_POLL_INTERVAL": "0.05", "SA_SHUTDOWN_GRACE": "2",
           "PROMETHEUS_MULTIPROC_DIR": None}
    log = tmp_path / "worker.log"
    marker = f"[hold] {uuid.uuid4()}"
    job = enqueue(pool, caller, marker)
    with run_process([sys.executable, "-m", "jobqueue.operator.cli", "run-worker",
                      "--concurrency", "1"], env, log):  # type: ignore[arg-type]
        held = holding.held(marker, timeout=20)
        with pool.connection() as conn:
            conn.execute("UPDATE sa_job SET state = 'cancelled', finished_at = now() "
                         "WHERE id = %s", (job.job_id,))
        cancelled_at = time.monotonic()

        _assert_cut(held, cancelled_at)
        follower = enqueue(pool, caller, "next in line")
        wait_for(lambda: _job(pool, follower.job_id)["state"] == "succeeded", timeout=5)
    assert _job(pool, job.job_id) == {"state": "cancelled", "response_id": None, "attempt": 1,
                                      "ledger": 0}
    lost = [line for line in log_lines(log)
            if line.get("job_id") == str(job.job_id) and line["event"] in (
                "job.claim_lost", "job.abandoned")]
    assert [(line["event"], line.get("found_by")) for line in lost] == [
        ("job.claim_lost", "event_log")]


class _CountingPool:
    """The test pool, counting the statements run through it."""

    def __init__(self, pool: ConnectionPool[DictConnection]) -> None:
        self.pool = pool
        self.statements = 0

    @contextlib.contextmanager
    def connection(self) -> Iterator[_CountingConnection]:
        with self.pool.connection() as conn:
            yield _CountingConnection(conn, self)


class _CountingConnection:
    def __init__(self, conn: DictConnection, counter: _CountingPool) -> None:
        self._conn = conn
        self._counter = counter

    def execute(self, query: str, params: object = None) -> Any:
        self._counter.statements += 1
        return self._conn.execute(query, params)


def test_a_look_costs_three_statements_whether_ten_or_ten_thousand_calls_are_in_flight(
    pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    watch = DepartureWatch("w-flat")
    counting = _CountingPool(pool)
    lent = cast(ConnectionPool[DictConnection], counting)
    assert watch.departed(lent, {}.get) == {}
    # NOTE: another worker's jobs leave `running` meanwhile; none of them is held here.
    for n in range(5):
        enqueue(pool, caller, f"someone else's {n}")
    taken = [job.id for job in claim(pool, "w-other", 5, 100)]
    with pool.connection() as conn:
        conn.execute("UPDATE sa_job SET state = 'cancelled', finished_at = now() "
                     "WHERE id = ANY(%s)", (taken,))
    assert len(taken) == 5

    costs = []
    for held in (10, 10_000):
        counting.statements = 0
        started = time.monotonic()
        held_ids = {uuid.uuid4(): 1 for _ in range(held)}
        assert watch.departed(lent, held_ids.get) == {}
        costs.append((counting.statements, time.monotonic() - started))

    assert [statements for statements, _ in costs] == [3, 3]
    assert costs[1][1] < 0.5, f"a look at 10,000 calls in flight took {costs[1][1]:.3f}s"
