"""Wait for a result: `Prefer: wait=N` on POST /prompt answers 200 with the finished job and its
response text, else the usual 202; the waiting request holds no pool connection."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.settings import Settings
from service.app import create_app
from service.events.hub import EventHub
from tests.helpers import WorkerHarness, wait_for

PROMPT = "/sa-core/v1/prompt"


def _post(client: falcon.testing.TestClient, auth: dict[str, str], text: str,
          prefer: str) -> falcon.testing.Result:
    return client.simulate_post(PROMPT, json={"text": text}, headers={**auth, "Prefer": prefer})


def test_a_job_finished_in_time_answers_200_with_its_response_text(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
) -> None:
    workers.start(listen=True, poll_interval=600)
    result = _post(client, auth, "quick one", "wait=20")
    assert result.status_code == 200, result.text
    assert result.json["state"] == "succeeded"
    assert "quick one" in result.json["response_text"]
    assert result.headers["location"].endswith(f"/jobs/{result.json['id']}")


def test_a_failed_job_answers_200_with_its_error_and_no_text(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
) -> None:
    workers.start(listen=True, poll_interval=600)
    result = _post(client, auth, "refused [fake:400]", "wait=20")
    assert result.status_code == 200, result.text
    assert (result.json["state"], result.json["response_text"]) == ("failed", None)
    assert result.json["error_kind"] is not None


def test_a_job_still_running_after_n_seconds_answers_the_usual_202(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
) -> None:
    workers.start(listen=True, poll_interval=600)
    started = time.monotonic()
    result = _post(client, auth, "slow [fake:latency=5]", "wait=1")
    assert result.status_code == 202, result.text
    assert 1 <= time.monotonic() - started < 4
    assert result.json["state"] == "queued"


@pytest.mark.parametrize("prefer", ["wait=61", "wait=-1", "wait=abc", "respond-async", "wait=05"])
def test_a_malformed_or_too_long_wait_answers_400_and_queues_nothing(
    client: falcon.testing.TestClient, auth: dict[str, str], prefer: str,
) -> None:
    result = _post(client, auth, "x", prefer)
    assert result.status_code == 400
    assert "Prefer" in result.json["title"] + result.json["description"]
    assert client.simulate_get("/sa-core/v1/mission/recent", headers=auth).json["items"] == []


@pytest.fixture
def one_connection(settings: Settings) -> Iterator[ConnectionPool[DictConnection]]:
    pool = open_pool(settings.database_url, name="one", min_size=1, max_size=1,
                     checkout_timeout=2.0)
    yield pool
    pool.close()


def test_waiting_requests_hold_no_pool_connection(
    settings: Settings, one_connection: ConnectionPool[DictConnection], auth: dict[str, str],
    workers: WorkerHarness,
) -> None:
    hub = EventHub.from_settings(one_connection, settings)
    client = falcon.testing.TestClient(create_app(settings, one_connection, hub=hub))
    answers: list[int] = []
    waiting = [threading.Thread(target=lambda: answers.append(
        _post(client, auth, "hold on [fake:latency=1]", "wait=20").status_code))
        for _ in range(3)]
    for thread in waiting:
        thread.start()
    # NOTE: three requests wait on a one-connection pool, and another request still gets it.
    wait_for(lambda: hub.watched_jobs == 3)
    assert client.simulate_get("/sa-core/v1/mission/recent", headers=auth).status_code == 200
    workers.start(listen=True, poll_interval=600)
    for thread in waiting:
        thread.join(timeout=20)
    hub.stop()
    assert answers == [200, 200, 200]
