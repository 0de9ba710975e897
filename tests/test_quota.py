"""The per-org cap on queued jobs (SA_ORG_MAX_QUEUED): 429 with Retry-After, nothing written, exact
under concurrency."""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace

import falcon.testing
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.queries import entity as entity_q
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import create_token
from jobqueue.engine.claim import claim
from jobqueue.engine.enqueue import QUEUE_FULL_RETRY_AFTER
from service.app import create_app
from tests.helpers import fetch_one, plan_nodes

PROMPT = "/sa-core/v1/prompt"


def capped_client(settings: Settings, pool: ConnectionPool[DictConnection],
                  cap: int) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(create_app(replace(settings, org_max_queued=cap), pool))


def counts(pool: ConnectionPool[DictConnection], org: int = 1) -> dict[str, int]:
    return fetch_one(pool, "SELECT (SELECT count(*) FROM sa_job WHERE org_id = %s) AS jobs, "
                           "(SELECT count(*) FROM sa_entity WHERE org_id = %s) AS entities, "
                           "(SELECT count(*) FROM sa_job_event WHERE org_id = %s) AS events",
                     org, org, org)


def test_a_full_queue_answers_429_with_retry_after_and_writes_nothing(
    settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
) -> None:
    client = capped_client(settings, pool, 3)
    jobs = [client.simulate_post(PROMPT, json={"text": f"job {i}"}, headers=auth) for i in range(3)]
    assert [j.status_code for j in jobs] == [202, 202, 202]
    before = counts(pool)
    full = client.simulate_post(PROMPT, json={"text": "one too many"}, headers=auth)
    assert full.status_code == 429
    assert full.headers["retry-after"] == str(QUEUE_FULL_RETRY_AFTER)
    assert set(full.json) == {"title", "description"} and "3" in full.json["description"]
    keyed = client.simulate_post(PROMPT, json={"text": "keyed"}, headers={**auth, "Idempotency-Key": "k"})
    assert keyed.status_code == 429
    assert counts(pool) == before
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_idempotency_key")["n"] == 0

    # Other orgs have their own cap; a teammate shares the org's.
    stranger = {"Authorization": f"Bearer {create_token(pool, 2, 20)}"}
    teammate = {"Authorization": f"Bearer {create_token(pool, 1, 11)}"}
    assert client.simulate_post(PROMPT, json={"text": "x"}, headers=stranger).status_code == 202
    assert client.simulate_post(PROMPT, json={"text": "x"}, headers=teammate).status_code == 429

    # A job that leaves the queue (cancelled, or claimed by a worker) frees a slot.
    cancel = client.simulate_post(f"/sa-core/v1/jobs/{jobs[0].json['job_id']}/cancel", headers=auth)
    assert cancel.status_code == 200
    assert client.simulate_post(PROMPT, json={"text": "fits again"}, headers=auth).status_code == 202
    assert client.simulate_post(PROMPT, json={"text": "full again"}, headers=auth).status_code == 429
    assert len(claim(pool, "test-worker", 1, 100)) == 1
    assert client.simulate_post(PROMPT, json={"text": "fits after a claim"}, headers=auth).status_code == 202


def test_the_cap_is_exact_under_concurrent_submits(
    settings: Settings, pool: ConnectionPool[DictConnection], auth: dict[str, str],
) -> None:
    cap, threads_n = 5, 24
    client = capped_client(settings, pool, cap)
    start = threading.Barrier(threads_n)
    statuses: list[int] = []
    lock = threading.Lock()

    def submit(i: int) -> None:
        start.wait(5)
        status = client.simulate_post(PROMPT, json={"text": f"burst {i}"}, headers=auth).status_code
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(statuses) == [202] * cap + [429] * (threads_n - cap)
    assert counts(pool)["jobs"] == cap


def test_uncapped_submits_are_not_limited(settings: Settings, pool: ConnectionPool[DictConnection],
                                          auth: dict[str, str]) -> None:
    client = capped_client(settings, pool, 0)
    for i in range(5):
        assert client.simulate_post(PROMPT, json={"text": f"{i}"}, headers=auth).status_code == 202


def test_the_cap_count_is_served_by_the_queued_index(many_jobs: DictConnection) -> None:
    many_jobs.execute("UPDATE sa_job SET state = 'cancelled' WHERE random() < 0.9")
    many_jobs.execute("ANALYZE sa_job")
    nodes = plan_nodes(many_jobs, entity_q.PROMPT_INSERT_WITH_JOB, {
        "parent_id": None, "org_id": 7, "user_id": 1, "token_hash": None, "text": "x", "priority": 50,
        "max_attempts": 3, "options": Jsonb({}), "max_queued": 10_000, "idempotency_key": "k",
        "request_hash": b"\0" * 32, "key_ttl": 86400, "prompt_id": uuid.uuid4(),
        "job_id": uuid.uuid4(), "run_at": None, "delay_seconds": None, "after": None,
        "max_chain_depth": 1000})
    # NOTE: either index of one org's queued jobs (0004's, or the fair claim's of 0014) serves it.
    assert {"sa_job_org_queued_idx", "sa_job_org_claim_idx"} & {n.get("Index Name") for n in nodes}, nodes
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "sa_job"]
