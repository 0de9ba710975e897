"""The spec's async-execution proof: queued -> running -> succeeded, with every durable artefact."""

from __future__ import annotations

import threading
from typing import Any

import falcon.testing
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import Caller
from jobqueue.engine.enqueue import enqueue
from service.app import create_app
from tests.helpers import WorkerHarness, fetch_all, fetch_one, job_state, submit, wait_for


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


def test_worker_claims_by_priority_then_age_and_respects_the_ceiling(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    ids = {p: submit(client, auth, text=f"p{p}", priority=p)["job_id"] for p in (90, 10, 50)}
    late_urgent = submit(client, auth, text="late", priority=10)["job_id"]

    workers.build(concurrency=1, batch_size=1, priority_ceiling=50).run(once=True)
    workers.build(concurrency=1, batch_size=1, priority_ceiling=50).run(once=True)
    workers.build(concurrency=1, batch_size=1, priority_ceiling=50).run(once=True)
    workers.build(concurrency=1, batch_size=1, priority_ceiling=50).run(once=True)

    order = fetch_all(pool, "SELECT job_id FROM sa_job_event WHERE to_state = 'running' ORDER BY id")
    assert [str(r["job_id"]) for r in order] == [ids[10], late_urgent, ids[50]]
    assert fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", ids[90])["state"] == "queued"

    workers.build(concurrency=1).run(once=True)
    assert fetch_one(pool, "SELECT state FROM sa_job WHERE id = %s", ids[90])["state"] == "succeeded"


def test_claim_takes_only_free_slots(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    for i in range(5):
        submit(client, auth, text=f"slot {i}")
    workers.build(concurrency=2).run(once=True)
    counts = fetch_all(pool, "SELECT state, count(*) AS n FROM sa_job GROUP BY state ORDER BY state")
    assert {r["state"]: r["n"] for r in counts} == {"queued": 3, "succeeded": 2}


def test_post_answers_202_while_the_provider_is_slow_and_the_job_finishes_without_a_client(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection], settings: Any,
) -> None:
    slow = submit(client, auth, text="slow one [fake:latency=3]")
    workers.start(concurrency=2)
    wait_for(lambda: job_state(client, auth, slow["job_id"]) == "running")

    quick = submit(client, auth, text="quick one")

    # NOTE: the 202 came back while the 3 s provider call was still in flight (the tests' provider
    # timeout is 5 s, one wall-clock deadline per call, so the call must be well under it).
    assert job_state(client, auth, slow["job_id"]) == "running"
    assert quick["state"] == "queued"
    wait_for(lambda: job_state(client, auth, quick["job_id"]) == "succeeded")
    assert job_state(client, auth, slow["job_id"]) == "running"

    later_client = falcon.testing.TestClient(create_app(settings, pool))
    wait_for(lambda: job_state(later_client, auth, slow["job_id"]) == "succeeded", timeout=15)
    prompt = later_client.simulate_get(f"/sa-core/v1/prompts/{slow['prompt_id']}", headers=auth).json
    assert prompt["response"]["content"] == "echo[1]: user:slow one [fake:latency=3]"
    assert [j["id"] for j in prompt["jobs"]] == [slow["job_id"]]


def test_concurrent_submits_with_different_parents_keep_their_own_thread(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
    pool: ConnectionPool[DictConnection],
) -> None:
    roots = [submit(client, auth, text=f"root {name}") for name in ("A", "B")]
    workers.build(concurrency=2).run(once=True)
    parents = [
        client.simulate_get(f"/sa-core/v1/prompts/{r['prompt_id']}", headers=auth).json["response"]["id"]
        for r in roots
    ]
    results: dict[str, dict[str, Any]] = {}

    def send(name: str, parent: str) -> None:
        results[name] = submit(client, auth, text=f"follow-up {name}", parent_id=parent)

    threads = [threading.Thread(target=send, args=(n, p)) for n, p in zip("AB", parents, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    workers.build(concurrency=2).run(once=True)

    for name, parent in zip("AB", parents, strict=True):
        body = client.simulate_get(f"/sa-core/v1/prompts/{results[name]['prompt_id']}", headers=auth).json
        assert body["prompt"]["parent_id"] == parent
        assert body["response"]["content"] == (
            f"echo[3]: user:root {name} | assistant:echo[1]: user:root {name} | user:follow-up {name}"
        )


def test_depth_option_limits_the_ancestors_sent(
    client: falcon.testing.TestClient, auth: dict[str, str], workers: WorkerHarness,
) -> None:
    parent = None
    for i in range(3):
        sent = submit(client, auth, text=f"turn {i}", **({"parent_id": parent} if parent else {}))
        workers.build().run(once=True)
        parent = client.simulate_get(f"/sa-core/v1/prompts/{sent['prompt_id']}",
                                     headers=auth).json["response"]["id"]
    last = submit(client, auth, text="last", parent_id=parent, options={"depth": 2})
    workers.build().run(once=True)
    body = client.simulate_get(f"/sa-core/v1/prompts/{last['prompt_id']}", headers=auth).json
    assert body["response"]["content"] == "echo[3]: user:turn 2 | assistant:echo[5]: " + (
        "user:turn 0 | assistant:echo[1]: user:turn 0 | user:turn 1 | assistant:echo[3]: user:turn 0 "
        "| assistant:echo[1]: user:turn 0 | user:turn 1 | user:turn 2 | user:last"
    )


def test_concurrent_workers_claim_a_thousand_jobs_exactly_once(
    workers: WorkerHarness, pool: ConnectionPool[DictConnection], caller: Caller,
) -> None:
    for i in range(1000):
        enqueue(pool, caller, f"bulk {i}")
    running = [workers.start(concurrency=8) for _ in range(4)]

    wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE state = 'succeeded'")[
        "n"] == 1000, timeout=90, interval=0.2)

    claims = fetch_one(pool, "SELECT count(*) AS n, count(DISTINCT job_id) AS jobs FROM sa_job_event "
                             "WHERE to_state = 'running'")
    assert claims == {"n": 1000, "jobs": 1000}
    responses = fetch_one(pool, "SELECT count(*) AS n, count(DISTINCT parent_id) AS prompts "
                                "FROM sa_entity WHERE kind = 'response'")
    assert responses == {"n": 1000, "prompts": 1000}
    per_worker = fetch_all(pool, "SELECT worker_claim, count(*) AS n FROM sa_job GROUP BY worker_claim")
    assert {r["worker_claim"] for r in per_worker} <= {w.worker_id for w in running}
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_ledger")["n"] == 1000
