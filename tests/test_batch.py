"""POST /prompts/batch: up to 1,000 prompts in one statement, all or none, ids in input order,
one Idempotency-Key for the batch, background priority by default."""

from __future__ import annotations

import uuid
from dataclasses import replace

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from service.app import create_app
from service.contract import MAX_BATCH
from tests.helpers import WorkerHarness, fetch_all, fetch_one, submit, wait_for

BATCH = "/sa-core/v1/prompts/batch"


def _jobs(pool: ConnectionPool[DictConnection]) -> int:
    return int(fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"])


def test_a_batch_is_queued_in_input_order_at_background_priority_and_runs(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    parent = submit(client, auth, text="the root")["prompt_id"]
    prompts = [{"text": f"item {n}"} for n in range(5)]
    prompts[2] = {"text": "urgent item", "priority": 5, "parent_id": parent}
    result = client.simulate_post(BATCH, json={"prompts": prompts}, headers=auth)
    assert result.status_code == 202, result.text
    items = result.json["items"]
    assert [item["state"] for item in items] == ["queued"] * 5

    rows = {str(r["job_id"]): r for r in fetch_all(
        pool, "SELECT j.id AS job_id, j.priority, e.content, e.parent_id FROM sa_job j "
              "JOIN sa_entity e ON e.id = j.prompt_id WHERE j.id = ANY(%s::uuid[])",
        [item["job_id"] for item in items])}
    assert [rows[item["job_id"]]["content"] for item in items] == [p["text"] for p in prompts]
    assert [rows[item["job_id"]]["priority"] for item in items] == [80, 80, 5, 80, 80]
    assert str(rows[items[2]["job_id"]]["parent_id"]) == parent

    workers.start(listen=True, poll_interval=0.05)
    wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE state = 'succeeded'")
             ["n"] == 6)


def test_every_bad_item_is_named_by_index_and_nothing_is_written(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
) -> None:
    before = _jobs(pool)
    prompts = [{"text": "fine"}, {"text": "  "}, {"text": "ok", "priority": 101}, "not an object",
               {"text": "x", "colour": "red"}, {"text": "x", "run_at": "2001-01-01T00:00:00Z"}]
    result = client.simulate_post(BATCH, json={"prompts": prompts}, headers=auth)
    assert result.status_code == 422
    assert result.json["description"].split("; ") == [
        "prompts[1].text: must not be empty",
        "prompts[2].priority: must be between 0 and 100",
        "prompts[3]: must be an object",
        "prompts[4].colour: unknown field",
        "prompts[5].run_at: is in the past"]
    assert _jobs(pool) == before


def test_an_unknown_parent_anywhere_refuses_the_whole_batch(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
    other_org_auth: dict[str, str],
) -> None:
    foreign = submit(client, other_org_auth, text="not yours")["prompt_id"]
    before = _jobs(pool)
    prompts = [{"text": "a"}, {"text": "b", "parent_id": str(uuid.uuid4())}, {"text": "c"},
               {"text": "d", "parent_id": foreign}]
    result = client.simulate_post(BATCH, json={"prompts": prompts}, headers=auth)
    assert result.status_code == 422
    assert result.json["description"] == (
        "prompts[1].parent_id: does not name an existing entity; "
        "prompts[3].parent_id: does not name an existing entity")
    assert _jobs(pool) == before


@pytest.mark.parametrize("body", [{"prompts": []}, {"prompts": [{"text": "x"}] * (MAX_BATCH + 1)},
                                  {"prompts": {"text": "x"}}, {}, {"prompts": [], "extra": 1}])
def test_empty_oversized_or_malformed_batches_answer_422(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
    body: dict[str, object],
) -> None:
    assert client.simulate_post(BATCH, json=body, headers=auth).status_code == 422
    assert _jobs(pool) == 0


def test_one_key_covers_the_batch_a_repeat_replays_every_id_and_another_body_is_refused(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
) -> None:
    headers = {**auth, "Idempotency-Key": "batch-1"}
    body = {"prompts": [{"text": "one"}, {"text": "two", "delay_seconds": 30}]}
    first = client.simulate_post(BATCH, json=body, headers=headers)
    again = client.simulate_post(BATCH, json=body, headers=headers)
    assert first.status_code == again.status_code == 202
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json == first.json
    assert _jobs(pool) == 2
    other = client.simulate_post(BATCH, json={"prompts": [{"text": "one"}]}, headers=headers)
    single = client.simulate_post("/sa-core/v1/prompt", json={"text": "one"}, headers=headers)
    assert other.status_code == single.status_code == 422
    assert _jobs(pool) == 2


def test_a_batch_that_does_not_fit_under_the_cap_writes_nothing(
    settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
) -> None:
    client = falcon.testing.TestClient(create_app(replace(settings, org_max_queued=3), pool))
    assert client.simulate_post(BATCH, json={"prompts": [{"text": "a"}] * 2},
                                headers=auth).status_code == 202
    refused = client.simulate_post(BATCH, json={"prompts": [{"text": "b"}] * 2}, headers=auth)
    assert refused.status_code == 429
    assert _jobs(pool) == 2
