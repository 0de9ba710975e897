"""Streamed text stored and read by delta (issue 28): a worker writes only what arrived, for every
streaming job in one statement per interval; GET /jobs assembles the rows; a hub reads only what
is new and reads again a row it skipped; the finalize and the leader's sweep delete the rows."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import partial as partial_q
from jobqueue.core.routes import Route
from jobqueue.core.settings import Settings
from jobqueue.devtools.fake_provider import FakeProvider
from jobqueue.runtime.streaming import sweep_ended
from service.events.deltas import DeltaReader
from tests.helpers import WorkerHarness, fetch_all, job_state, submit, wait_for

API = "/sa-core/v1"
WORDS = " ".join(f"w{i}" for i in range(30))
JOBS = 6
ROWS = 'SELECT job_id, "offset", text FROM sa_job_delta WHERE job_id = ANY(%s) ORDER BY seq'
RUNNING = ("UPDATE sa_job SET state = 'running', worker_claim = 'w1', claimed_at = now(), "
           "started_at = now(), running_heartbeat_at = now() WHERE id = ANY(%s)")


@pytest.fixture
def streamed(base_settings: Settings, fake: FakeProvider) -> Settings:
    return replace(base_settings, provider_url="", stream_interval=0.1,
                   provider_routes=(Route("streamed", fake.url, stream=True),))


def _append(conn: DictConnection, job_id: str, offset: int, text: str) -> None:
    lost = conn.execute(partial_q.JOB_DELTA_APPEND_MANY_IF_CLAIMED, {
        "job_id": [uuid.UUID(job_id)], "claim": ["w1"], "attempt": [1], "offset": [offset],
        "text": [text]}).fetchall()
    assert lost == []


def _contiguous(rows: list[dict[str, Any]]) -> bool:
    """Each job's rows, in write order, start at 0 and each where the previous ended."""
    ends: dict[uuid.UUID, int] = {}
    for row in rows:
        if row["offset"] != ends.get(row["job_id"], 0):
            return False
        ends[row["job_id"]] = row["offset"] + len(row["text"])
    return True


def _streaming(client: falcon.testing.TestClient, auth: dict[str, str],
               jobs: list[str]) -> dict[str, Any] | None:
    """A job of `jobs` whose GET shows some text so far, if any."""
    for job_id in jobs:
        job: dict[str, Any] = client.simulate_get(f"{API}/jobs/{job_id}", headers=auth).json
        if len(job["partial_text"] or "") > 20:
            return job
    return None


def test_streaming_jobs_append_only_their_new_text_in_one_statement_per_interval(
        streamed: Settings, pool: ConnectionPool[DictConnection],
        client: falcon.testing.TestClient, auth: dict[str, str]) -> None:
    jobs = [submit(client, auth, text=f"{n} {WORDS} [fake:stream-gap=0.03]")["job_id"]
            for n in range(JOBS)]
    harness = WorkerHarness(streamed, pool)
    try:
        deltas = harness.start(concurrency=JOBS).executor.deltas
        # NOTE: mid-stream, GET /jobs assembles the rows written so far.
        job = wait_for(lambda: _streaming(client, auth, jobs), timeout=20)
        rows = fetch_all(pool, ROWS, jobs)
        wait_for(lambda: all(job_state(client, auth, job_id) == "succeeded" for job_id in jobs),
                 timeout=30)
    finally:
        harness.stop_all()
    answer = client.simulate_get(f"{API}/jobs/{job['id']}", headers=auth).json
    assert answer["partial_text"] is None
    # NOTE: the rows were read just after the GET, so they may hold more.
    assert "".join(r["text"] for r in rows if str(r["job_id"]) == job["id"]).startswith(
        job["partial_text"])
    # A row holds what arrived within one interval, never the text before it.
    assert _contiguous(rows) and len(rows) > JOBS
    # Statements wrote the new text of several jobs at once: 6 jobs of 32 pieces over ~1 s
    # each, written at most every 0.1 s (a statement per job and write would make them equal).
    assert deltas.rows >= 2 * JOBS and deltas.writes < deltas.rows, (deltas.writes, deltas.rows)
    # The finalize deleted every job's rows.
    assert fetch_all(pool, ROWS, jobs) == []


def test_a_hub_reads_only_new_rows_and_again_a_row_it_skipped_and_the_sweep_clears_ended_ones(
        pool: ConnectionPool[DictConnection], client: falcon.testing.TestClient,
        auth: dict[str, str]) -> None:
    late, early = (submit(client, auth, text=f"delta {n}")["job_id"] for n in range(2))
    with pool.connection() as conn:
        conn.execute(RUNNING, ([late, early],))
    reader = DeltaReader(text_chars=100)
    with pool.connection() as look:
        assert reader.read(look) == []
        # NOTE: `late`'s first row takes its seq, then commits after `early`'s (two workers'
        # writes commit in either order): the hub's next look moves past it unseen.
        with pool.connection() as slow, slow.transaction():
            _append(slow, late, 0, "abc")
            with pool.connection() as quick:
                _append(quick, early, 0, "xyz")
            seen = reader.read(look)
        assert [(str(d.job_id), d.offset, d.text) for d in seen] == [(early, 0, "xyz")]
        with pool.connection() as conn:
            _append(conn, late, 3, "def")
            _append(conn, early, 3, "!")
        seen = reader.read(look)
        # Only what is new for `early`; `late`'s row starts past what was sent, so the skipped
        # one is read again and the delta starts at 0.
        assert sorted((str(d.job_id), d.offset, d.text) for d in seen) == sorted(
            [(late, 0, "abcdef"), (early, 3, "!")])
        assert reader.read(look) == []
        assert client.simulate_get(f"{API}/jobs/{late}", headers=auth).json[
            "partial_text"] == "abcdef"

        assert client.simulate_post(f"{API}/jobs/{late}/cancel", headers=auth).status_code == 200
        assert sweep_ended(look) == 2
    assert [str(r["job_id"]) for r in fetch_all(pool, ROWS, [late, early])] == [early, early]
