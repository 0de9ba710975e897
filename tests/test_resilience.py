"""Outages: the web answers a JSON 503 while Postgres is unreachable; worker and web recover alone."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import falcon.testing
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import Caller
from jobqueue.engine.enqueue import enqueue
from service.app import create_app
from tests.conftest import WorkerHarness, fetch_one, wait_for
from tests.helpers import submit
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
