"""A claim says how many jobs it chose besides those it took, so a worker tells a queue that
another claim holds from an empty one (jobqueue/runtime/worker.py claims again only then)."""

from __future__ import annotations

import psycopg
from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from jobqueue.core.tokens import Caller
from jobqueue.engine.claim import claim_round
from jobqueue.engine.enqueue import enqueue

CALLER = Caller(org_id=1, user_id=10)


def test_an_empty_queue_is_a_claim_that_chose_nothing(pool: ConnectionPool[DictConnection]) -> None:
    taken = claim_round(pool, "w1", 8, 100)

    assert (taken.jobs, taken.chosen) == ([], 0)


def test_a_claim_that_drains_the_queue_took_all_it_chose(
    pool: ConnectionPool[DictConnection],
) -> None:
    ids = {enqueue(pool, CALLER, f"drained {n}").job_id for n in range(3)}

    taken = claim_round(pool, "w1", 8, 100)

    assert {job.id for job in taken.jobs} == ids
    assert taken.chosen == 3


def test_a_head_another_claim_holds_is_chosen_but_not_taken(
    pool: ConnectionPool[DictConnection], database_url: str,
) -> None:
    held = enqueue(pool, CALLER, "held by another claim").job_id
    free = enqueue(pool, CALLER, "free").job_id

    with psycopg.connect(database_url) as other:
        other.execute("SELECT id FROM sa_job WHERE id = %s FOR UPDATE", (held,))
        taken = claim_round(pool, "w1", 8, 100)
        alone = claim_round(pool, "w2", 8, 100)
        other.rollback()

    assert [job.id for job in taken.jobs] == [free]
    assert taken.chosen == 2, "more may wait: the held job is still queued"
    assert (alone.jobs, alone.chosen) == ([], 1)
    assert [job.id for job in claim_round(pool, "w3", 8, 100).jobs] == [held]
