"""Outages: the web answers a JSON 503 while Postgres is unreachable, and only then; worker and web
recover alone; connections the server closed while idle are replaced before anyone notices."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import falcon.testing
import httpx
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import Caller
from jobqueue.engine.enqueue import Submission, enqueue, enqueue_many
from service.app import create_app
from tests.helpers import WorkerHarness, fetch_all, fetch_one, submit, wait_for
from tests.processes import gunicorn
from tests.tcp_proxy import TcpProxy


@pytest.fixture
def proxy(database_url: str) -> Iterator[TcpProxy]:
    params = conninfo_to_dict(database_url)
    proxy = TcpProxy(str(params.get("host", "127.0.0.1")), int(params.get("port", 5432)))
    yield proxy
    proxy.close()


@pytest.fixture
def proxied(settings: Settings, proxy: TcpProxy) -> Settings:
    url = make_conninfo(settings.database_url, host="127.0.0.1", port=str(proxy.port))
    return replace(settings, database_url=url, direct_database_url=url)


def state(pool: ConnectionPool[DictConnection], job_id: object) -> str:
    return str(fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", job_id)["state"])


def test_web_answers_503_during_an_outage_and_recovers(
    proxied: Settings, proxy: TcpProxy, auth: dict[str, str],
) -> None:
    web_pool = open_pool(proxied.database_url, name="web-outage", max_size=4, checkout_timeout=1.0)
    try:
        client = falcon.testing.TestClient(create_app(proxied, web_pool))
        assert client.simulate_get("/readyz").status_code == 200
        submit(client, auth, text="before")

        proxy.cut()
        for result in (client.simulate_get("/readyz"),
                       client.simulate_post("/sa-core/v1/prompt", json={"text": "during"}, headers=auth)):
            assert result.status_code == 503
            assert set(result.json) == {"title", "description"}

        proxy.restore()
        wait_for(lambda: client.simulate_get("/readyz").status_code == 200)
        submit(client, auth, text="after")
    finally:
        web_pool.close()


def test_a_session_the_server_ends_under_a_request_is_retried_not_shown(
    proxied: Settings, proxy: TcpProxy, auth: dict[str, str], pool: ConnectionPool[DictConnection],
    caller: Caller,
) -> None:
    web_pool = open_pool(proxied.database_url, name="web-killed", max_size=2)
    try:
        client = falcon.testing.TestClient(create_app(replace(proxied, token_cache_ttl=0),
                                                      web_pool))
        first = submit(client, auth, text="before the kill")
        for request in (
            lambda: client.simulate_post("/sa-core/v1/prompt", json={"text": "after the kill"},
                                         headers=auth),
            lambda: client.simulate_get(f"/sa-core/v1/jobs/{first['job_id']}", headers=auth),
        ):
            proxy.terminate_on_next_query()
            result = request()
            assert result.status_code in (200, 202), result.text
        # NOTE: through the engine, so that the kill lands on the batch's own write (a request's
        # first statement is its token lookup).
        proxy.terminate_on_next_query()
        written = enqueue_many(web_pool, caller, [Submission("batch after the kill"),
                                                  Submission("and its second")])
        assert len(written) == 2
        assert [r["content"] for r in fetch_all(
            pool, "SELECT content FROM sa_entity WHERE kind = 'prompt' ORDER BY created_at, content")] == [
            "before the kill", "after the kill", "and its second", "batch after the kill"]
    finally:
        web_pool.close()


def test_a_kill_still_under_way_on_the_other_idle_sessions_is_not_shown(
    proxied: Settings, proxy: TcpProxy, auth: dict[str, str], pool: ConnectionPool[DictConnection],
) -> None:
    web_pool = open_pool(proxied.database_url, name="web-killing", min_size=3, max_size=3)
    try:
        client = falcon.testing.TestClient(create_app(replace(proxied, token_cache_ttl=0),
                                                      web_pool))
        submit(client, auth, text="before the kill")
        wait_for(lambda: web_pool.get_stats().get("pool_available", 0) == 3)
        # NOTE: the request's first session fails on its first statement and the next two still
        # look alive at checkout: only a round trip shows they are going too.
        proxy.terminate_each_on_its_next_query()
        result = client.simulate_post("/sa-core/v1/prompt", json={"text": "during the kill"},
                                      headers=auth)
        assert result.status_code == 202, result.text
        assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE id = %s",
                         result.json["job_id"])["n"] == 1
    finally:
        web_pool.close()


def test_worker_survives_a_database_outage_and_loses_nothing(
    proxied: Settings, proxy: TcpProxy, pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    harness = WorkerHarness(proxied, open_pool(proxied.database_url, name="worker-outage", max_size=6,
                                               checkout_timeout=1.0))
    try:
        before = enqueue(pool, caller, "before the outage").job_id
        worker = harness.start(concurrency=2)
        wait_for(lambda: state(pool, before) == "succeeded")

        proxy.cut()
        during = [enqueue(pool, caller, f"queued during the outage {i}").job_id for i in range(5)]
        wait_for(lambda: worker.claim_failures >= 2)
        assert all(state(pool, job) == "queued" for job in during)

        proxy.restore()
        wait_for(lambda: all(state(pool, job) == "succeeded" for job in during), timeout=20)
    finally:
        harness.stop_all()
        harness.pool.close()


def idle_pids(pool: ConnectionPool[DictConnection], count: int) -> list[int]:
    """Opens `count` connections in `pool` at once and returns their backend pids, left idle."""
    with contextlib.ExitStack() as stack:
        conns = [stack.enter_context(pool.connection()) for _ in range(count)]
        return [conn.info.backend_pid for conn in conns]


def terminate(pool: ConnectionPool[DictConnection], pids: list[int]) -> None:
    with pool.connection() as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
    wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM pg_stat_activity "
                                     "WHERE pid = ANY(%s)", pids)["n"] == 0)


def test_killed_idle_connections_are_replaced_before_a_request_notices(
    settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
) -> None:
    web_pool = open_pool(settings.database_url, name="web-killed", max_size=6, checkout_timeout=2.0)
    try:
        client = falcon.testing.TestClient(create_app(settings, web_pool))
        terminate(pool, idle_pids(web_pool, 6))
        for i in range(3):
            submit(client, auth, text=f"after the kill {i}")
        assert client.simulate_get("/readyz").status_code == 200
    finally:
        web_pool.close()


def test_an_outage_that_is_over_answers_no_503(
    proxied: Settings, proxy: TcpProxy, auth: dict[str, str],
) -> None:
    web_pool = open_pool(proxied.database_url, name="web-over", max_size=4, checkout_timeout=2.0)
    try:
        client = falcon.testing.TestClient(create_app(proxied, web_pool))
        idle_pids(web_pool, 4)
        proxy.cut()
        proxy.restore()
        submit(client, auth, text="right after the outage")

        proxy.cut()
        during = client.simulate_post("/sa-core/v1/prompt", json={"text": "during"}, headers=auth)
        assert during.status_code == 503
        proxy.restore()
        submit(client, auth, text="right after the second outage")
    finally:
        web_pool.close()


def test_the_gevent_web_process_replaces_killed_connections_without_a_503(
    settings: Settings, tmp_path: Path, pool: ConnectionPool[DictConnection],
    auth: dict[str, str],
) -> None:
    name = f"sa-web-{uuid.uuid4().hex[:8]}"
    with gunicorn(settings, tmp_path, PGAPPNAME=name) as base, \
            httpx.Client(base_url=base, headers=auth, timeout=10) as http:
        # NOTE: concurrent submits grow the web's pool past one connection.
        with ThreadPoolExecutor(8) as burst:
            assert set(burst.map(lambda i: http.post("/sa-core/v1/prompt", json={"text": f"b{i}"})
                                 .status_code, range(40))) == {202}
        pids = [row["pid"] for row in fetch_all(
            pool, "SELECT pid FROM pg_stat_activity WHERE application_name = %s", name)]
        assert len(pids) >= 2
        terminate(pool, pids)
        answers = [http.post("/sa-core/v1/prompt", json={"text": f"after {i}"}).status_code
                   for i in range(5)]
        assert answers == [202] * 5
