"""Jobs per second of one worker process burning down a backlog against the fake provider.

Usage: .venv/bin/python -m bench.worker_throughput [--jobs 5000] [--concurrency 8] [--workers 1]
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.common import VENV_BIN, scratch_database, spawn, wait_http
from jobqueue.db import open_pool
from jobqueue.queries import health

BACKLOG = """
WITH p AS (
    INSERT INTO sa_entity (id, kind, org_id, created_by, correlation_id, content)
    SELECT g, 'prompt', 1, 1, g, 'bench prompt ' || n
      FROM (SELECT gen_random_uuid() AS g, n FROM generate_series(1, %s) n) s
    RETURNING id
)
INSERT INTO sa_job (id, prompt_id, org_id, created_by) SELECT gen_random_uuid(), id, 1, 1 FROM p
"""
DONE = "SELECT count(*) AS n FROM sa_job WHERE state = 'succeeded'"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--provider-port", type=int, default=8766)
    args = parser.parse_args()
    with scratch_database() as url:
        pool = open_pool(url, name="bench", max_size=2)
        provider = spawn([str(VENV_BIN / "sa-core"), "fake-provider", "--port", str(args.provider_port)], {})
        workers = []
        try:
            wait_http(f"http://127.0.0.1:{args.provider_port}/healthz")
            with pool.connection() as conn:
                conn.execute(BACKLOG, (args.jobs,))
                conn.execute(health.HEALTH_PING)
            started = time.monotonic()
            env = {"DATABASE_URL": url, "SA_PROVIDER_URL": f"http://127.0.0.1:{args.provider_port}"}
            workers = [spawn([sys.executable, "-m", "jobqueue.cli", "run-worker", "--concurrency",
                              str(args.concurrency)], env) for _ in range(args.workers)]
            while True:
                with pool.connection() as conn:
                    row = conn.execute(DONE).fetchone()
                if row is not None and row["n"] >= args.jobs:
                    break
                time.sleep(0.05)
            elapsed = time.monotonic() - started
        finally:
            for proc in [*workers, provider]:
                proc.terminate()
            for proc in [*workers, provider]:
                proc.wait(timeout=30)
            pool.close()
    print(f"{args.jobs} jobs, {args.workers} worker process(es) x concurrency {args.concurrency}: "
          f"{elapsed:.2f} s, {args.jobs / elapsed:.0f} jobs/s (includes worker start-up)")


if __name__ == "__main__":
    main()
