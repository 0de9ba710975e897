"""Fixtures: one throwaway database per test run, the fake provider over real HTTP, workers in threads."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace

import falcon.testing
import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import Caller, create_token
from jobqueue.devtools.embedded_db import LOCAL_POSTGRES, admin_conninfo, scratch_database
from jobqueue.devtools.fake_provider import FakeConfig, FakeProvider
from jobqueue.operator.cli import main
from service.app import create_app
from service.events.hub import EventHub
from tests.helpers import TableReset, WorkerHarness

# PERF: pytest keeps the test modules it rewrites (for its assertion messages) as bytecode only
# where bytecode may be written; with PYTHONDONTWRITEBYTECODE set, as on this machine, every run
# (every xdist worker) rewrote all 80 of them again: 3 s of CPU of collection. Allowed while
# collecting only (tests/__pycache__, ignored by git); put back once the tests are collected.
_DONT_WRITE_BYTECODE = sys.dont_write_bytecode
sys.dont_write_bytecode = False


def pytest_collection_finish(session: pytest.Session) -> None:
    sys.dont_write_bytecode = _DONT_WRITE_BYTECODE


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, the controller finds the admin server before the workers start.

    NOTE: with no Postgres at 127.0.0.1:5432, each worker would otherwise start the embedded
    one over the same data folder at once; started here, it lives as long as the run, and
    the workers (which inherit the environment) are handed its address.
    """
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        admin = admin_conninfo(TEST_ADMIN)
        if admin != LOCAL_POSTGRES:
            os.environ[TEST_ADMIN] = admin


TEST_ADMIN = "SA_TEST_DATABASE_URL"
"""The variable naming the admin server the tests make their databases on (else the local one,
else an embedded one: jobqueue/devtools/embedded_db.py, admin_conninfo)."""

TABLES = ("sa_job_event", "sa_ledger", "sa_audit", "sa_edge", "sa_job", "sa_entity", "sa_api_token",
          "sa_job_archive", "sa_job_event_archive", "sa_ledger_archive", "sa_route_pause",
          "sa_route_window", "sa_job_quarantine", "sa_file", "sa_file_chunk", "sa_batch",
          "sa_batch_request", "sa_org_spend", "sa_ops_action", "sa_org_token_window", "sa_worker",
          "sa_job_delta")
"""What every test that uses the database starts from empty (and the tables referencing them)."""


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    with scratch_database("sa_test", TEST_ADMIN) as url:
        yield url


@pytest.fixture
def empty_database(database_url: str) -> Iterator[str]:
    """A database of its own with nothing in it, not even the migrations; dropped afterwards."""
    name = f"sa_empty_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    try:
        yield make_conninfo(database_url, dbname=name)
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def fake() -> Iterator[FakeProvider]:
    with FakeProvider(config=FakeConfig()) as provider:
        yield provider


@pytest.fixture(scope="session")
def base_settings(database_url: str, fake: FakeProvider) -> Settings:
    return Settings(
        database_url=database_url,
        direct_database_url=database_url,
        provider_url=fake.url,
        provider_api_key="test-key",
        provider_model="fake-model",
        provider_timeout=5.0,
        heartbeat_interval=0.2,
        stale_after=1.0,
        stuck_after=5.0,
        poll_interval=0.05,
        reclaim_interval=0.2,
        backoff_base=0.05,
        backoff_cap=1.0,
        rate_limit_min_wait=0.2,
        shutdown_grace=2.0,
    )


@pytest.fixture
def settings(base_settings: Settings) -> Settings:
    return base_settings


@pytest.fixture(scope="session")
def pool(base_settings: Settings) -> Iterator[ConnectionPool[DictConnection]]:
    pool = open_pool(base_settings.database_url, name="tests", max_size=20)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def _table_reset(database_url: str) -> Iterator[TableReset]:
    reset = TableReset(database_url, TABLES)
    yield reset
    reset.close()


@pytest.fixture(autouse=True)
def _clean_tables(request: pytest.FixtureRequest) -> None:
    if "database_url" not in request.fixturenames:
        return
    request.getfixturevalue("_table_reset")()


@pytest.fixture
def truncated_tables(_table_reset: TableReset) -> None:
    """For the tests of plans: no table keeps the pages of rows an earlier test deleted (until a
    vacuum they count in the planner's estimates, and move plans at the margin)."""
    _table_reset(truncate=True)


@pytest.fixture
def many_jobs(pool: ConnectionPool[DictConnection], truncated_tables: None) -> Iterator[DictConnection]:
    """5,000 queued jobs over 50 orgs in a transaction rolled back afterwards, analyzed, so
    EXPLAIN shows the plans a real backlog gets."""
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        conn.execute("INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, content) "
                     "SELECT g, 'prompt', (n % 50) + 1, 1, g, 'x' FROM (SELECT gen_random_uuid() AS g, n "
                     "FROM generate_series(1, 5000) n) s")
        conn.execute("INSERT INTO sa_job (id, prompt_id, org_id, created_by, priority) "
                     "SELECT gen_random_uuid(), id, org_id, 1, (random() * 100)::int FROM sa_entity")
        conn.execute("ANALYZE sa_job")
        yield conn


@pytest.fixture
def cli(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str]], int]:
    """`jobqueue.operator.cli.main` with DATABASE_URL pointing at the test database."""
    monkeypatch.setenv("DATABASE_URL", settings.database_url)
    return main


@pytest.fixture
def hub(pool: ConnectionPool[DictConnection], settings: Settings) -> Iterator[EventHub]:
    """The app's hub, reading every 50 ms without LISTEN (see the wake-up test for LISTEN)."""
    hub = EventHub.from_settings(pool, replace(settings, listen=False))
    yield hub
    hub.stop()


@pytest.fixture
def app(settings: Settings, pool: ConnectionPool[DictConnection],
        hub: EventHub) -> falcon.App[falcon.Request, falcon.Response]:
    return create_app(settings, pool, hub=hub)


@pytest.fixture
def client(settings: Settings,
           pool: ConnectionPool[DictConnection]) -> Iterator[falcon.testing.TestClient]:
    # NOTE: the app's event hub starts on the first /mission read; stopped here so no test
    # leaves a reader (and its LISTEN session) running into the next.
    hub = EventHub.from_settings(pool, settings)
    yield falcon.testing.TestClient(create_app(settings, pool, hub=hub))
    hub.stop()


@pytest.fixture
def caller() -> Caller:
    return Caller(org_id=1, user_id=10)


@pytest.fixture
def auth(pool: ConnectionPool[DictConnection], caller: Caller) -> dict[str, str]:
    token = create_token(pool, caller.org_id, caller.user_id)
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def other_org_auth(pool: ConnectionPool[DictConnection]) -> dict[str, str]:
    return {"Authorization": f"Bearer {create_token(pool, 2, 20)}"}


@pytest.fixture
def workers(settings: Settings, pool: ConnectionPool[DictConnection]) -> Iterator[WorkerHarness]:
    harness = WorkerHarness(settings, pool)
    yield harness
    harness.stop_all()
