"""Fair sharing under a flood: org A queues 20,000 jobs at priority 0, then org B 100 at priority 0
and 100 at priority 50. Prints B's waits against A's, and the claim's time with and without the
flood.

Usage: .venv/bin/python -m bench.fairness [--flood 20000] [--batch 32] [--pace 0.05] [--aging 5]

On a scratch database, a simulated worker fleet claims `--batch` jobs every `--pace` seconds
(the claim statement the workers run, `jobqueue.engine.claim.claim`; the jobs are left running,
which the claim does not look at) until every job of B is claimed. A job's wait is claimed_at
minus scheduled_for. `--aging` is SA_PRIORITY_AGING, short here so B's priority-50 jobs show it
within the run. The claim time is the median of 50 claims of `--batch` jobs on a short queue
(2 orgs, just enough for the 50 claims), then the same on top of the flood.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.common import format_table, percentile, scratch_database
from jobqueue.core.db import open_pool
from jobqueue.core.tokens import Caller
from jobqueue.engine.claim import claim
from jobqueue.engine.enqueue import Submission, enqueue_many

A, B = Caller(1, 1), Caller(2, 2)
WAITS = """
SELECT org_id, priority, extract(epoch FROM claimed_at - scheduled_for)::float8 AS wait
  FROM sa_job WHERE claimed_at IS NOT NULL
"""


def _queue(pool: object, caller: Caller, n: int, priority: int) -> None:
    for start in range(0, n, 1000):
        enqueue_many(pool, caller,  # type: ignore[arg-type]
                     [Submission(text="bench", priority=priority)] * min(1000, n - start))


def _claim_ms(pool: object, batch: int, aging: float, rounds: int = 50) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        claim(pool, "bench", batch, 100, priority_aging=aging)  # type: ignore[arg-type]
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--pace", type=float, default=0.05)
    parser.add_argument("--aging", type=float, default=5.0)
    args = parser.parse_args()
    with scratch_database() as url:
        pool = open_pool(url, name="bench-fairness", max_size=2)
        # NOTE: claim time without the flood: a short queue over two orgs, enough for every claim.
        _queue(pool, A, 100 + 50 * args.batch, 0)
        _queue(pool, B, 100 + 50 * args.batch, 0)
        with pool.connection() as conn:
            conn.execute("ANALYZE sa_job")
        quiet = _claim_ms(pool, args.batch, args.aging)
        with pool.connection() as conn:
            conn.execute("TRUNCATE sa_job, sa_job_event, sa_entity CASCADE")

        _queue(pool, A, args.flood, 0)
        with pool.connection() as conn:
            conn.execute("ANALYZE sa_job")
        _queue(pool, B, 100, 0)
        _queue(pool, B, 100, 50)
        started = time.monotonic()
        while True:
            claim(pool, "fleet", args.batch, 100, priority_aging=args.aging)
            with pool.connection() as conn:
                left = conn.execute("SELECT count(*) AS n FROM sa_job WHERE org_id = 2 "
                                    "AND state = 'queued'").fetchone()
            if left is not None and left["n"] == 0:
                break
            time.sleep(args.pace)
        elapsed = time.monotonic() - started
        with pool.connection() as conn:
            rows = conn.execute(WAITS).fetchall()
        flooded = _claim_ms(pool, args.batch, args.aging)
        pool.close()

    def waits(org: int, priority: int) -> list[float]:
        return [r["wait"] for r in rows if r["org_id"] == org and r["priority"] == priority]

    table = [["jobs", "claimed", "wait p50 s", "wait p99 s"]]
    for name, org, priority in (("A, priority 0 (flood)", 1, 0), ("B, priority 0", 2, 0),
                                ("B, priority 50", 2, 50)):
        w = waits(org, priority)
        table.append([name, str(len(w)), f"{percentile(w, 50):.2f}", f"{percentile(w, 99):.2f}"])
    print(f"fleet: {args.batch} jobs every {args.pace} s; SA_PRIORITY_AGING={args.aging:g}; "
          f"B fully claimed after {elapsed:.1f} s")
    print(format_table(table, left=1))
    print()
    print(format_table([["queue", f"claim of {args.batch}, median ms"],
                        [f"{2 * (100 + 50 * args.batch):,} jobs, 2 orgs", f"{quiet:.2f}"],
                        [f"{args.flood:,}-job flood + B", f"{flooded:.2f}"]], left=1))


if __name__ == "__main__":
    main()
