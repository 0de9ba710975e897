"""Fair sharing: within a priority, claims alternate between orgs with queued work, so one org's
flood does not starve another's; priorities still come first; a job due for SA_PRIORITY_AGING
seconds is claimed ahead of every priority."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import falcon.testing
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import Caller, create_token
from jobqueue.engine.claim import claim
from jobqueue.engine.enqueue import Submission, enqueue_many
from service.app import create_app
from tests.helpers import fetch_one

A, B, C = Caller(1, 10), Caller(2, 20), Caller(3, 30)


def _flood(pool: ConnectionPool[DictConnection], caller: Caller, n: int, priority: int) -> None:
    enqueue_many(pool, caller, [Submission(text=f"org {caller.org_id}", priority=priority)] * n)


def test_a_flooding_org_does_not_starve_the_others_within_a_priority(
    pool: ConnectionPool[DictConnection],
) -> None:
    _flood(pool, A, 500, 0)
    _flood(pool, B, 6, 0)
    _flood(pool, C, 3, 0)
    first = Counter(job.org_id for job in claim(pool, "w1", 12, 100))
    # NOTE: turns: one job of each org, then the next of each, while they last.
    assert first == {1: 5, 2: 4, 3: 3}
    second = Counter(job.org_id for job in claim(pool, "w1", 12, 100))
    assert second == {1: 10, 2: 2}


def test_priority_still_comes_first_across_orgs(pool: ConnectionPool[DictConnection]) -> None:
    _flood(pool, A, 20, 0)
    _flood(pool, B, 5, 50)
    assert {job.org_id for job in claim(pool, "w1", 20, 100)} == {1}
    assert Counter(job.org_id for job in claim(pool, "w1", 10, 100)) == {2: 5}


def test_a_job_waiting_past_the_aging_age_goes_before_every_priority(
    pool: ConnectionPool[DictConnection],
) -> None:
    _flood(pool, B, 3, 90)
    _flood(pool, A, 50, 0)
    with pool.connection() as conn:
        conn.execute("UPDATE sa_job SET scheduled_for = now() - interval '10 minutes' "
                     "WHERE org_id = 2")
    claimed = claim(pool, "w1", 5, 100, priority_aging=300.0)
    assert Counter(job.org_id for job in claimed) == {2: 3, 1: 2}
    # NOTE: younger than the age, the same jobs wait behind the flood.
    _flood(pool, C, 2, 90)
    assert {job.org_id for job in claim(pool, "w1", 40, 100, priority_aging=300.0)} == {1}


def test_a_batch_over_http_shares_the_queue_with_a_flood_already_waiting(
    settings: Settings, pool: ConnectionPool[DictConnection],
) -> None:
    client = falcon.testing.TestClient(create_app(replace(settings, org_max_queued=0), pool))
    _flood(pool, A, 300, 80)
    token = create_token(pool, B.org_id, B.user_id)
    posted = client.simulate_post("/sa-core/v1/prompts/batch",
                                  json={"prompts": [{"text": "b"}] * 4},
                                  headers={"Authorization": f"Bearer {token}"})
    assert posted.status_code == 202
    assert Counter(job.org_id for job in claim(pool, "w1", 8, 100)) == {1: 4, 2: 4}
    assert fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE org_id = 2 "
                           "AND state = 'running'")["n"] == 4
