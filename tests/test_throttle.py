"""Provider rate limits (issue 14, item 5): a 429 pauses the route for every worker and puts the
job back without spending an attempt; configured per-route limits hold across workers; a cap
stops a job from waiting throttled for ever."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.logs import configure_logging
from jobqueue.core.routes import Route
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import Caller
from jobqueue.devtools.fake_provider import FakeConfig, FakeProvider
from jobqueue.engine import throttle
from jobqueue.engine.enqueue import enqueue
from jobqueue.runtime.gate import RouteGate
from tests.helpers import WorkerHarness, fetch_all, fetch_one, submit, wait_for
from tests.metrics_page import scrape, value
from tests.processes import log_lines, run_process

API = "/sa-core/v1"
JOBS = "SELECT state, attempt FROM sa_job ORDER BY created_at"


@pytest.fixture
def throttling() -> Iterator[FakeProvider]:
    # NOTE: the whole deployment answers 429 (Retry-After: 1) for 1.5 s after its first call.
    with FakeProvider(config=FakeConfig(throttle_seconds=1.5, throttle_retry_after="1")) as fake:
        yield fake


def test_a_throttling_provider_shared_by_three_workers_pauses_them_all_and_spends_no_attempt(
        settings: Settings, pool: ConnectionPool[DictConnection], caller: Caller,
        throttling: FakeProvider, tmp_path: Path) -> None:
    jobs = [enqueue(pool, caller, f"throttled {i}") for i in range(24)]
    env = {"DATABASE_URL": settings.database_url, "SA_PROVIDER_URL": throttling.url,
           "SA_POLL_INTERVAL": "0.05", "SA_SHUTDOWN_GRACE": "2", "SA_RATE_LIMIT_MIN_WAIT": "0.2",
           "PROMETHEUS_MULTIPROC_DIR": None}
    argv = [sys.executable, "-m", "jobqueue.operator.cli", "run-worker", "--concurrency", "8"]
    logs = [tmp_path / f"worker{n}.log" for n in range(3)]
    with contextlib.ExitStack() as stack:
        for log in logs:
            stack.enter_context(run_process(argv, env, log))  # type: ignore[arg-type]
        wait_for(lambda: all(r["state"] == "succeeded" for r in fetch_all(pool, JOBS)),
                 timeout=60)

    # NOTE: nothing failed and no attempt was spent, however many 429s each job met.
    assert {(r["state"], r["attempt"]) for r in fetch_all(pool, JOBS)} == {("succeeded", 1)}
    arrivals = throttling.arrivals
    throttled = [t for t, limited in arrivals if limited]
    assert throttled, "the provider never throttled"
    calls = fetch_one(pool, "SELECT count(*) FILTER (WHERE outcome = 'rate_limit') AS limited, "
                            "count(*) FILTER (WHERE outcome = 'succeeded') AS ok FROM sa_ledger")
    assert (calls["limited"], calls["ok"]) == (len(throttled), len(jobs))
    # NOTE: after the first 429 (Retry-After: 1), no worker calls until the pause ends: calls
    # already in flight land within a few ms, a worker's copy of the pauses is at most 50 ms old.
    first = throttled[0]
    assert not [t - first for t, _ in arrivals if first + 0.3 < t < first + 0.9]
    events = [e for log in logs for e in log_lines(log)]
    paused = [e for e in events if e.get("event") == "route.throttled"]
    assert paused and {(e["route"], e["reason"]) for e in paused} == {("default", "429")}
    put_back = [e for e in events if e.get("event") == "job.throttled"]
    assert len(put_back) >= len(throttled) and all(e["attempt"] == 1 for e in put_back)


def test_a_configured_requests_limit_holds_across_workers(
        base_settings: Settings, pool: ConnectionPool[DictConnection], caller: Caller) -> None:
    with FakeProvider(config=FakeConfig()) as fake:
        capped = replace(base_settings, provider_url="", route_limit_window=0.5,
                         provider_routes=(Route("capped", fake.url, rpm=2),))
        jobs = [enqueue(pool, caller, f"limited {i}") for i in range(6)]
        harness = WorkerHarness(capped, pool)
        try:
            harness.start()
            harness.start()
            wait_for(lambda: all(r["state"] == "succeeded" for r in fetch_all(pool, JOBS)),
                     timeout=20)
        finally:
            harness.stop_all()
        arrivals = sorted(t for t, _ in fake.arrivals)
    assert len(arrivals) == len(jobs)
    assert {(r["state"], r["attempt"]) for r in fetch_all(pool, JOBS)} == {("succeeded", 1)}
    # NOTE: two calls per 0.5 s window whichever worker makes them: any five calls span three
    # windows, so more than one whole window.
    assert all(arrivals[i + 4] - arrivals[i] > 0.5 for i in range(len(arrivals) - 4)), arrivals
    pause = fetch_one(pool, "SELECT reason FROM sa_route_pause WHERE route = 'capped'")
    assert pause["reason"] == "limit"


def test_past_the_cap_a_429_spends_attempts_so_no_job_waits_for_ever(
        client: falcon.testing.TestClient, auth: dict[str, str], settings: Settings,
        pool: ConnectionPool[DictConnection]) -> None:
    before = scrape(client)
    done = submit(client, auth, text="always busy [fake:429=0.05]", max_attempts=2)
    harness = WorkerHarness(replace(settings, throttle_max_wait=0.3), pool)
    try:
        harness.start()
        wait_for(lambda: fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s",
                                   done["job_id"])["state"] == "failed", timeout=20)
    finally:
        harness.stop_all()
    job = client.simulate_get(f"{API}/jobs/{done['job_id']}", headers=auth).json
    assert (job["attempt"], job["error_kind"]) == (2, "rate_limit")
    attempts = [u["attempt"] for u in job["usage"]]
    # NOTE: attempt 1 is put back for 0.3 s (no attempt spent), then spends itself; so does 2.
    assert attempts.count(1) > 1 and attempts[-1] == 2
    assert value(scrape(client), "sa_route_throttled_total", route="default", reason="429") > value(
        before, "sa_route_throttled_total", route="default", reason="429")


def test_a_call_claimed_before_another_workers_429_waits_out_the_pause(
        pool: ConnectionPool[DictConnection]) -> None:
    # NOTE: a slow or cold worker: its claim round read the pauses before the 429, its call
    # comes after it. The gate reads them again before the call.
    route = Route(name="default", base_url="http://127.0.0.1:9")
    gate = RouteGate(pool, refresh=0.0, window=60.0)
    assert gate.all_paused([route]) is False
    throttle.pause(pool, "default", 30.0, "429")

    assert 25.0 < gate.admit(route).wait <= 30.0


def test_a_call_goes_by_the_pauses_it_has_when_the_database_cannot_be_read(
        settings: Settings, pool: ConnectionPool[DictConnection],
        capfd: pytest.CaptureFixture[str]) -> None:
    configure_logging(buffered=False)
    throttle.pause(pool, "default", 30.0, "429")
    route = Route(name="default", base_url="http://127.0.0.1:9")
    own = open_pool(settings.database_url, name="gate-test", max_size=1)
    gate = RouteGate(own, refresh=0.0, window=60.0)
    assert gate.all_paused([route]) is True
    own.close()

    ticket = gate.admit(route)
    assert 25.0 < ticket.wait <= 30.0
    logged = [json.loads(line) for line in capfd.readouterr().err.splitlines()
              if line.startswith("{")]
    assert [e["event"] for e in logged if e["event"].startswith("gate.")] == ["gate.refresh_failed"]
