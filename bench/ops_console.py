"""What the operator console's reads and bulk actions cost over a large history, through the engine.

A history of --jobs jobs over 50 orgs (a tenth queued, the rest finished, one in a hundred
failed with a searchable message) is written in one statement and analyzed; then each console
read runs --rounds times (median and slowest printed): the explorer's newest page, a page
filtered by org, by state and org (one that matches one row in a hundred, one that matches
none and so walks the whole history), by a text found in few prompts, the count shown before a
bulk action; then one bulk cancel of every queued job of one org in batches of --batch.

    .venv/bin/python -m bench.ops_console --jobs 200000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from bench.common import format_table, scratch_database
from jobqueue.core.console import BulkAction, JobFilter
from jobqueue.core.db import open_pool
from jobqueue.core.tokens import Caller
from jobqueue.engine.bulk import run_bulk
from jobqueue.engine.console import count_jobs, explore_jobs

OPERATOR = Caller(org_id=9, user_id=90, scopes=frozenset({"ops"}))

_HISTORY = """
WITH p AS (
    INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, content)
    SELECT g, 'prompt', (n %% 50) + 1, 1, g,
           CASE WHEN n %% 997 = 0 THEN 'needle prompt ' ELSE 'bench prompt ' END || n
      FROM (SELECT gen_random_uuid() AS g, n FROM generate_series(1, %(jobs)s) n) s
    RETURNING id, org_id, correlation_id
), numbered AS (
    SELECT id, org_id, row_number() OVER () AS n FROM p
)
INSERT INTO sa_job (id, prompt_id, org_id, created_by, state, finished_at, error_kind,
                    error_message, scheduled_for, created_at)
SELECT gen_random_uuid(), id, org_id, 1,
       CASE WHEN n %% 10 = 0 THEN 'queued' WHEN n %% 100 = 1 THEN 'failed' ELSE 'cancelled' END,
       CASE WHEN n %% 10 = 0 THEN NULL ELSE now() END,
       CASE WHEN n %% 100 = 1 THEN 'provider_4xx' END,
       CASE WHEN n %% 100 = 1 THEN 'provider answered 400' END,
       now() + interval '1 day', now() - make_interval(secs => %(jobs)s - n)
  FROM numbered
"""


def _timed(work: Callable[[], object], rounds: int) -> tuple[float, float]:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    with scratch_database() as url:
        pool = open_pool(url, name="bench-ops", max_size=2)
        try:
            with pool.connection() as conn:
                conn.execute("ALTER TABLE sa_job DISABLE TRIGGER USER")
                conn.execute(_HISTORY, {"jobs": args.jobs})
                conn.execute("ALTER TABLE sa_job ENABLE TRIGGER USER")
                conn.execute("ANALYZE sa_job")
                conn.execute("ANALYZE sa_entity")
            reads = {
                "newest page (50)": lambda: explore_jobs(pool, JobFilter(), after=None, limit=50),
                "page, org 7": lambda: explore_jobs(pool, JobFilter(org_id=7), after=None, limit=50),
                "page, failed of org 2 (1 row in 100)": lambda: explore_jobs(
                    pool, JobFilter(states=("failed",), org_id=2), after=None, limit=50),
                "page, failed of org 7 (none: walks all)": lambda: explore_jobs(
                    pool, JobFilter(states=("failed",), org_id=7), after=None, limit=50),
                "page, text 'needle'": lambda: explore_jobs(
                    pool, JobFilter(text="needle"), after=None, limit=50),
                "count, queued of org 1": lambda: count_jobs(
                    pool, JobFilter(states=("queued",), org_id=1), 10_001),
            }
            rows = [["read", "median ms", "slowest ms"]]
            for name, work in reads.items():
                median, slowest = _timed(work, args.rounds)
                rows.append([name, f"{median:.1f}", f"{slowest:.1f}"])
            print(f"{args.jobs:,} jobs over 50 orgs, {args.rounds} rounds")
            print(format_table(rows, left=1))
            queued = count_jobs(pool, JobFilter(states=("queued",), org_id=1), 10_001)
            started = time.perf_counter()
            done = run_bulk(pool, BulkAction.CANCEL, OPERATOR,
                            job_filter=JobFilter(states=("queued",), org_id=1),
                            max_jobs=min(queued, 10_000), batch_size=args.batch)
            took = time.perf_counter() - started
            print(f"bulk cancel of org 1's {queued:,} queued jobs: {done.changed:,} cancelled in "
                  f"{done.batches} batches of {args.batch}, {took:.2f} s "
                  f"({done.changed / took:,.0f} jobs/s)")
        finally:
            pool.close()


if __name__ == "__main__":
    main()
