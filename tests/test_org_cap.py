"""A per-org running cap keeps one tenant's bulk work from starving the others."""

from __future__ import annotations

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import Caller
from jobqueue.engine.enqueue import enqueue
from tests.helpers import WorkerHarness, fetch_all, fetch_one, wait_for

RUNNING_BY_ORG = "SELECT org_id, count(*) AS n FROM sa_job WHERE state = 'running' GROUP BY org_id"


def test_capped_claims_leave_room_for_other_orgs_across_workers(
    workers: WorkerHarness, pool: ConnectionPool[DictConnection],
) -> None:
    bulk, small = Caller(org_id=1, user_id=1), Caller(org_id=2, user_id=2)
    for i in range(8):
        enqueue(pool, bulk, f"bulk {i} [fake:latency=1.5]", priority=10)
    for i in range(2):
        enqueue(pool, small, f"interactive {i} [fake:latency=1.5]", priority=50)

    for _ in range(2):
        workers.start(concurrency=4, org_max_running=2)

    wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE state = 'running'")["n"]
             == 4)
    assert {r["org_id"]: r["n"] for r in fetch_all(pool, RUNNING_BY_ORG)} == {1: 2, 2: 2}

    wait_for(lambda: fetch_one(pool, "SELECT count(*) AS n FROM sa_job WHERE state = 'succeeded'")[
        "n"] == 10, timeout=30)
    peak = fetch_one(pool, """
        SELECT max(n) AS peak FROM (
            SELECT e.at, (SELECT count(*) FROM sa_job_event r
                           WHERE r.org_id = 1 AND r.to_state = 'running' AND r.id <= e.id)
                       - (SELECT count(*) FROM sa_job_event f
                           WHERE f.org_id = 1 AND f.from_state = 'running' AND f.id <= e.id) AS n
              FROM sa_job_event e WHERE e.org_id = 1) s""")
    assert peak["peak"] == 2
