"""The spec's async-execution proof: queued -> running -> succeeded, with every durable artefact."""

from __future__ import annotations

from typing import Any

import falcon.testing
from psycopg_pool import ConnectionPool

from jobqueue.db import DictConnection
from tests.conftest import WorkerHarness, fetch_all, fetch_one


def submit(client: falcon.testing.TestClient, auth: dict[str, str], **body: Any) -> dict[str, Any]:
    result = client.simulate_post("/sa-core/v1/prompt", json=body, headers=auth)
    assert result.status_code == 202, result.text
    return dict(result.json)


def test_prompt_runs_to_succeeded_with_response_edge_ledger_and_audit(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    submitted = submit(client, auth, text="what is a queue?")
    assert submitted["state"] == "queued"
    assert fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", submitted["job_id"])[
        "state"] == "queued"

    workers.build().run(once=True)

    job = client.simulate_get(f"/sa-core/v1/jobs/{submitted['job_id']}", headers=auth).json
    assert job["state"] == "succeeded"
    assert job["attempt"] == 1
    response = fetch_one(pool, "SELECT * FROM sa_entity WHERE id = %s", job["response_id"])
    assert response["kind"] == "response"
    assert str(response["parent_id"]) == submitted["prompt_id"]
    assert str(response["causation_id"]) == submitted["prompt_id"]
    assert response["content"] == "echo[1]: user:what is a queue?"
    edge = fetch_one(pool, "SELECT * FROM sa_edge WHERE to_id = %s", job["response_id"])
    assert (str(edge["from_id"]), edge["kind"]) == (submitted["prompt_id"], "flows-to")
    ledger = fetch_all(pool, "SELECT * FROM sa_ledger WHERE job_id = %s", submitted["job_id"])
    assert [(r["attempt"], r["outcome"], r["http_status"]) for r in ledger] == [
        (1, "succeeded", 200)]
    assert ledger[0]["tokens_in"] == 4 and ledger[0]["model"] == "fake-model"
    audit = fetch_all(pool, "SELECT action FROM sa_audit WHERE job_id = %s", submitted["job_id"])
    assert [a["action"] for a in audit] == ["response.created"]
    events = fetch_all(pool, "SELECT from_state, to_state FROM sa_job_event WHERE job_id = %s "
                             "ORDER BY id", submitted["job_id"])
    assert [(e["from_state"], e["to_state"]) for e in events] == [
        (None, "queued"), ("queued", "running"), ("running", "succeeded")]
