"""How long ending the first job of a long chain takes, deep and wide, through the engine.

A chain of N waiting jobs (each after the previous one, or all after the first) is written in one
statement, then its first job is cancelled (`jobqueue/engine/control.py`, as POST
/jobs/{id}/cancel and `sa-core cancel-job` do: the job and every waiting job after it, event rows
included), then retried (the same chain re-armed in the retry's transaction). Each shape runs
`--rounds` times; the table prints the median and the slowest.

    .venv/bin/python -m bench.chains --jobs 10000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

from psycopg_pool import ConnectionPool

from bench.common import format_table, scratch_database
from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.tokens import Caller
from jobqueue.engine.control import cancel_job, retry_job
from jobqueue.engine.enqueue import enqueue

CALLER = Caller(org_id=1, user_id=1)

_CHAIN = """
WITH links AS (
    SELECT n, gen_random_uuid() AS prompt_id, gen_random_uuid() AS job_id
      FROM generate_series(1, %(jobs)s) n
), prompts AS (
    INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, content)
    SELECT prompt_id, 'prompt', 1, 1, prompt_id, 'link ' || n FROM links
)
INSERT INTO sa_job (id, prompt_id, org_id, created_by, after_job_id, waiting, chain_depth)
SELECT l.job_id, l.prompt_id, 1, 1,
       CASE WHEN %(deep)s AND l.n > 1 THEN prev.job_id ELSE %(root)s::uuid END, true,
       CASE WHEN %(deep)s THEN l.n ELSE 1 END
  FROM links l LEFT JOIN links prev ON prev.n = l.n - 1
"""


def _round(conn: DictConnection, pool: ConnectionPool[DictConnection], jobs: int,
           deep: bool) -> tuple[float, float]:
    """One chain built, ended and re-armed; the seconds the end and the re-arm took."""
    root = enqueue(pool, CALLER, "first of the chain", delay_seconds=3600)
    conn.execute(_CHAIN, {"jobs": jobs, "deep": deep, "root": root.job_id})
    conn.execute("ANALYZE sa_job")
    started = time.perf_counter()
    cancel_job(pool, root.job_id, CALLER.org_id)
    cancelled = time.perf_counter() - started
    started = time.perf_counter()
    retry_job(pool, root.job_id, CALLER.org_id)
    rearmed = time.perf_counter() - started
    return cancelled, rearmed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs after the first one")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rows = []
    with scratch_database() as url:
        pool = open_pool(url, name="bench-chains", max_size=2)
        try:
            with pool.connection() as conn:
                for shape in ("deep", "wide"):
                    times = [_round(conn, pool, args.jobs, shape == "deep")
                             for _ in range(args.rounds)]
                    for what, column in (("cancel (chain ended)", 0), ("retry (chain re-armed)", 1)):
                        seconds = [t[column] for t in times]
                        rows.append([shape, what, f"{args.jobs:,}",
                                     f"{statistics.median(seconds) * 1000:.0f}",
                                     f"{max(seconds) * 1000:.0f}"])
        finally:
            pool.close()
    print(format_table([["shape", "operation", "jobs after the first", "median ms", "slowest ms"],
                        *rows], left=2))


if __name__ == "__main__":
    main()
