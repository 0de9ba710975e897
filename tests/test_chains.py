"""Chains: `after` makes a prompt wait for another job of the org; its success releases it (in the
predecessor's finalize, not by polling) into the predecessor's thread; its failure, cancellation
or supersession ends it with error_kind dependency_failed; a retry of the failed predecessor
re-arms it."""

from __future__ import annotations

import uuid

import falcon.testing
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from tests.helpers import WorkerHarness, fetch_one, job_state, submit, wait_for

API = "/sa-core/v1"


def _job(client: falcon.testing.TestClient, auth: dict[str, str], job_id: str) -> dict[str, object]:
    return dict(client.simulate_get(f"{API}/jobs/{job_id}", headers=auth).json)


def _parent(pool: ConnectionPool[DictConnection], prompt_id: str) -> object:
    return fetch_one(pool, "SELECT parent_id FROM sa_entity WHERE id = %s", prompt_id)["parent_id"]


def test_a_dependent_waits_then_runs_in_its_predecessors_thread_without_polling(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    first = submit(client, auth, text="step one [fake:latency=0.5]")
    second = submit(client, auth, text="step two", after=first["job_id"])
    third = submit(client, auth, text="step three", after=second["prompt_id"])
    waiting = _job(client, auth, second["job_id"])
    assert waiting["state"] == "queued" and waiting["after_job_id"] == first["job_id"]
    assert waiting["waiting"] is True

    workers.start(listen=True, poll_interval=600)
    wait_for(lambda: job_state(client, auth, third["job_id"]) == "succeeded")
    first_response = _job(client, auth, first["job_id"])["response_id"]
    second_response = _job(client, auth, second["job_id"])["response_id"]
    assert str(_parent(pool, second["prompt_id"])) == first_response
    assert str(_parent(pool, third["prompt_id"])) == second_response
    # NOTE: the fake provider echoes its context: step two saw step one's exchange.
    answer = client.simulate_get(f"{API}/prompts/{second['prompt_id']}", headers=auth).json
    assert "step one" in answer["response"]["content"]


def test_an_explicit_parent_id_wins_over_the_predecessors_response(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    root = submit(client, auth, text="another thread")["prompt_id"]
    first = submit(client, auth, text="first")
    second = submit(client, auth, text="second", after=first["job_id"], parent_id=root)
    workers.start(listen=True, poll_interval=600)
    wait_for(lambda: job_state(client, auth, second["job_id"]) == "succeeded")
    assert str(_parent(pool, second["prompt_id"])) == root


def test_a_failed_predecessor_ends_its_chain_and_its_retry_rearms_it(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
) -> None:
    first = submit(client, auth, text="flaky [fake:flaky=1]", max_attempts=1)
    second = submit(client, auth, text="then this", after=first["job_id"])
    third = submit(client, auth, text="and this", after=second["job_id"])
    workers.start(listen=True, poll_interval=600)
    wait_for(lambda: job_state(client, auth, third["job_id"]) == "cancelled")
    for job_id in (second["job_id"], third["job_id"]):
        ended = _job(client, auth, job_id)
        assert (ended["state"], ended["error_kind"]) == ("cancelled", "dependency_failed")
    assert first["job_id"] in str(_job(client, auth, second["job_id"])["error_message"])

    retried = client.simulate_post(f"{API}/prompts/{first['prompt_id']}/retry", headers=auth)
    assert retried.status_code == 202, retried.text

    def latest_state(prompt_id: str) -> str:
        jobs = client.simulate_get(f"{API}/prompts/{prompt_id}", headers=auth).json["jobs"]
        return str(jobs[0]["state"])

    wait_for(lambda: latest_state(third["prompt_id"]) == "succeeded")
    assert latest_state(second["prompt_id"]) == "succeeded"
    assert job_state(client, auth, second["job_id"]) == "superseded"


def test_cancelling_a_predecessor_ends_its_dependents(
    client: falcon.testing.TestClient, auth: dict[str, str],
) -> None:
    first = submit(client, auth, text="never runs", delay_seconds=3600)
    second = submit(client, auth, text="waits", after=first["prompt_id"])
    assert client.simulate_post(f"{API}/jobs/{first['job_id']}/cancel",
                                headers=auth).status_code == 200
    ended = _job(client, auth, second["job_id"])
    assert (ended["state"], ended["error_kind"]) == ("cancelled", "dependency_failed")


def test_after_an_unknown_foreign_or_failed_job_answers_422_and_queues_nothing(
    client: falcon.testing.TestClient, auth: dict[str, str], other_org_auth: dict[str, str],
    pool: ConnectionPool[DictConnection],
) -> None:
    foreign = submit(client, other_org_auth, text="theirs")["job_id"]
    doomed = submit(client, auth, text="doomed", delay_seconds=3600)["job_id"]
    client.simulate_post(f"{API}/jobs/{doomed}/cancel", headers=auth)
    before = fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"]
    for after, named in [(str(uuid.uuid4()), "names no job or prompt"),
                         (foreign, "names no job or prompt"), (doomed, "is cancelled")]:
        result = client.simulate_post(f"{API}/prompt", json={"text": "x", "after": after},
                                      headers=auth)
        assert result.status_code == 422
        assert named in result.json["description"]
    result = client.simulate_post(f"{API}/prompt", json={"text": "x", "after": doomed,
                                                          "delay_seconds": 5}, headers=auth)
    assert result.status_code == 422
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == before


def test_after_a_job_already_succeeded_runs_at_once_in_its_thread(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    workers.start(listen=True, poll_interval=600)
    first = submit(client, auth, text="done already")
    wait_for(lambda: job_state(client, auth, first["job_id"]) == "succeeded")
    second = submit(client, auth, text="follow-up", after=first["prompt_id"])
    wait_for(lambda: job_state(client, auth, second["job_id"]) == "succeeded")
    assert str(_parent(pool, second["prompt_id"])) == _job(client, auth, first["job_id"])["response_id"]
