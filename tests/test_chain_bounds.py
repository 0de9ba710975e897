"""Chains are bounded and settled by the engine: a chain of 2,000 jobs, deep or wide, ends with its
first job in one answer (0014's triggers overflowed the stack at about 800 links; bench/chains.py
times 10,000), a re-arm counts against the org's queue cap, the depth is capped at submit, and
the leader's sweep settles a chain left waiting on a job that already ended."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import falcon.testing
import pytest
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import Caller
from jobqueue.engine import chains
from service.app import create_app
from tests.helpers import WorkerHarness, fetch_all, fetch_one, job_state, submit, wait_for

API = "/sa-core/v1"


@pytest.fixture
def bounded(settings: Settings, pool: ConnectionPool[DictConnection]
            ) -> Iterator[falcon.testing.TestClient]:
    """A client whose app caps chains at 3 predecessors and the org's queue at 50 jobs."""
    yield falcon.testing.TestClient(create_app(
        replace(settings, chain_max_depth=3, org_max_queued=50), pool))


def build_chain(pool: ConnectionPool[DictConnection], caller: Caller, root_job_id: str, jobs: int,
                *, deep: bool) -> list[uuid.UUID]:
    """Writes `jobs` waiting jobs after `root_job_id` in one statement: each after the previous
    (deep) or all after the root (wide). Building thousands of links through the API takes
    minutes."""
    prompt_ids = [uuid.uuid4() for _ in range(jobs)]
    job_ids = [uuid.uuid4() for _ in range(jobs)]
    root = uuid.UUID(root_job_id)
    afters = [root, *job_ids[:-1]] if deep else [root] * jobs
    depths = list(range(1, jobs + 1)) if deep else [1] * jobs
    with pool.connection() as conn, conn.transaction():
        conn.execute(
            "INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, content) "
            "SELECT p, 'prompt', %(org)s, %(user)s, p, 'link' FROM unnest(%(prompts)s::uuid[]) p",
            {"org": caller.org_id, "user": caller.user_id, "prompts": prompt_ids})
        conn.execute(
            "INSERT INTO sa_job (id, prompt_id, org_id, created_by, after_job_id, waiting, "
            "chain_depth) SELECT j, p, %(org)s, %(user)s, a, true, d "
            "FROM unnest(%(jobs)s::uuid[], %(prompts)s::uuid[], %(afters)s::uuid[], "
            "%(depths)s::int[]) AS t(j, p, a, d)",
            {"org": caller.org_id, "user": caller.user_id, "jobs": job_ids,
             "prompts": prompt_ids, "afters": afters, "depths": depths})
    return job_ids


def states(pool: ConnectionPool[DictConnection], job_ids: list[uuid.UUID]) -> dict[Any, int]:
    rows = fetch_all(pool, "SELECT state, error_kind, waiting, count(*) AS n FROM sa_job "
                           "WHERE id = ANY(%s) GROUP BY 1, 2, 3", job_ids)
    return {(r["state"], r["error_kind"], r["waiting"]): r["n"] for r in rows}


@pytest.mark.parametrize("deep", [True, False], ids=["deep", "wide"])
def test_cancelling_the_first_of_2000_chained_jobs_ends_them_all_and_a_retry_rearms_them(
    client: falcon.testing.TestClient, auth: dict[str, str], caller: Caller,
    pool: ConnectionPool[DictConnection], deep: bool,
) -> None:
    root = submit(client, auth, text="first of many", delay_seconds=3600)
    chain = build_chain(pool, caller, root["job_id"], 2_000, deep=deep)

    cancelled = client.simulate_post(f"{API}/jobs/{root['job_id']}/cancel", headers=auth)
    assert cancelled.status_code == 200, cancelled.text
    assert states(pool, chain) == {("cancelled", "dependency_failed", False): 2_000}
    last = fetch_one(pool, "SELECT error_message FROM sa_job WHERE id = %s", chain[-1])
    assert root["job_id"] in last["error_message"]

    retried = client.simulate_post(f"{API}/prompts/{root['prompt_id']}/retry", headers=auth)
    assert retried.status_code == 202, retried.text
    assert states(pool, chain) == {("superseded", "dependency_failed", False): 2_000}
    # NOTE: each link now waits on the new job of its old predecessor, in the same shape.
    links = fetch_one(pool, """
        SELECT count(*) AS waiting,
               count(*) FILTER (WHERE n.after_job_id = %s) AS on_root,
               count(*) FILTER (WHERE p.supersedes = o.after_job_id) AS on_new_predecessor
          FROM sa_job n JOIN sa_job o ON o.id = n.supersedes
          LEFT JOIN sa_job p ON p.id = n.after_job_id
         WHERE n.supersedes = ANY(%s) AND n.waiting AND n.state = 'queued'
    """, uuid.UUID(retried.json["job_id"]), chain)
    assert links["waiting"] == 2_000
    assert links["on_new_predecessor"] == 2_000
    assert links["on_root"] == (1 if deep else 2_000)


def test_a_failed_first_job_ends_its_deep_chain_in_the_workers_finalize(
    client: falcon.testing.TestClient, auth: dict[str, str], caller: Caller,
    pool: ConnectionPool[DictConnection], workers: WorkerHarness,
) -> None:
    root = submit(client, auth, text="refused [fake:400]", max_attempts=1)
    chain = build_chain(pool, caller, root["job_id"], 2_000, deep=True)
    workers.start()
    # NOTE: the chain is settled just after the finalize commits, by the same worker.
    wait_for(lambda: states(pool, chain) == {("cancelled", "dependency_failed", False): 2_000},
             timeout=30)
    assert job_state(client, auth, root["job_id"]) == "failed"


def test_a_chain_longer_than_its_cap_is_refused_with_422_naming_it(
    bounded: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
) -> None:
    previous = submit(bounded, auth, text="link 0", delay_seconds=3600)
    for n in range(1, 4):
        previous = submit(bounded, auth, text=f"link {n}", after=previous["job_id"])
    before = fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"]
    refused = bounded.simulate_post(f"{API}/prompt", json={"text": "link 4",
                                                             "after": previous["job_id"]},
                                    headers=auth)
    assert refused.status_code == 422
    assert "SA_CHAIN_MAX_DEPTH" in refused.json["description"]
    assert "3 jobs before this one" in refused.json["description"]
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job")["n"] == before


def test_a_retry_that_rearms_past_the_queue_cap_answers_429_and_changes_nothing(
    bounded: falcon.testing.TestClient, auth: dict[str, str], caller: Caller,
    pool: ConnectionPool[DictConnection],
) -> None:
    root = submit(bounded, auth, text="root", delay_seconds=3600)
    chain = build_chain(pool, caller, root["job_id"], 49, deep=False)
    for _ in range(3):
        assert bounded.simulate_post(f"{API}/jobs/{root['job_id']}/cancel",
                                     headers=auth).status_code == 200
        retried = bounded.simulate_post(f"{API}/prompts/{root['prompt_id']}/retry", headers=auth)
        assert retried.status_code == 202, retried.text
        root = {"job_id": retried.json["job_id"], "prompt_id": root["prompt_id"]}
        assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE state = 'queued'")["n"] == 50

    assert bounded.simulate_post(f"{API}/jobs/{root['job_id']}/cancel",
                                 headers=auth).status_code == 200
    submit(bounded, auth, text="another", delay_seconds=3600)
    before = fetch_all(pool, "SELECT id, state FROM sa_job ORDER BY id")
    refused = bounded.simulate_post(f"{API}/prompts/{root['prompt_id']}/retry", headers=auth)
    assert refused.status_code == 429
    assert refused.headers["Retry-After"]
    assert "50 queued jobs" in refused.json["description"]
    assert fetch_all(pool, "SELECT id, state FROM sa_job ORDER BY id") == before
    assert len(chain) == 49


def test_the_sweep_settles_chains_left_waiting_on_a_job_ended_or_deleted_by_hand(
    client: falcon.testing.TestClient, auth: dict[str, str], pool: ConnectionPool[DictConnection],
) -> None:
    ended = submit(client, auth, text="ended by SQL", delay_seconds=3600)
    first = submit(client, auth, text="waits", after=ended["job_id"])
    second = submit(client, auth, text="waits too", after=first["job_id"])
    gone = submit(client, auth, text="deleted by SQL", delay_seconds=3600)
    orphan = submit(client, auth, text="orphan", after=gone["job_id"])
    with pool.connection() as conn:
        # NOTE: what an operator's psql session does without the engine (no settling).
        conn.execute("UPDATE sa_job SET state = 'cancelled', finished_at = now() WHERE id = %s",
                     (ended["job_id"],))
        conn.execute("DELETE FROM sa_job_event WHERE job_id = %s", (gone["job_id"],))
        conn.execute("DELETE FROM sa_job WHERE id = %s", (gone["job_id"],))
    assert job_state(client, auth, second["job_id"]) == "queued"

    with pool.connection() as conn:
        settled = chains.sweep(conn)
    assert settled == chains.Settled(released=0, cancelled=3)
    for job in (first, second, orphan):
        body = client.simulate_get(f"{API}/jobs/{job['job_id']}", headers=auth).json
        assert (body["state"], body["error_kind"], body["waiting"]) == (
            "cancelled", "dependency_failed", False)
    assert "no longer exists" in client.simulate_get(
        f"{API}/jobs/{orphan['job_id']}", headers=auth).json["error_message"]
    with pool.connection() as conn:
        assert chains.sweep(conn) == chains.Settled()

