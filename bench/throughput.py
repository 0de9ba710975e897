"""Jobs per second burning down a backlog, by worker processes x concurrency, and commits per job.

Usage: .venv/bin/python -m bench.throughput [--jobs 5000] [--procs 1,4] [--concurrency 1,8,32]
       [--rounds 1] [--priced 0,1]

For each (processes, concurrency): a scratch database with `--jobs` queued prompts (written by one
INSERT statement), `sa-core fake-provider` in its own process (answers at once), then N x
`sa-core run-worker --concurrency C`. Time runs from the workers' start (their start-up
included) until every job has succeeded, polled every 50 ms. Rounds are interleaved.

Cost per job: round trips are the workers' own counts (claim statements and finalize batches, from
their `worker.stopped` log line on stderr; a batch is one statement, whatever its outcomes).
Commits, inserts and updates come from the scratch database's `pg_stat_database`, read before the
workers start and after they and the poller have exited (a backend flushes its counters on exit),
this script's own polls subtracted. Commits include the transactions in which each LISTENing worker
reads notifications (Postgres wakes every listener of the database on each notifying commit), so
they exceed the workers' own statements.

`--priced 1` runs the same burn-down with the model on a route that has `prices` and with a
daily budget no org reaches (SA_ORG_BUDGET_DAILY): every finalize then writes each call's cost
(sa_ledger.cost, sa_org_spend) and each worker re-reads the orgs past a budget once a second.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

import psycopg

from bench.common import BACKLOG, REPO, VENV_BIN, format_table, scratch_database, spawn, wait_http

DONE = "SELECT count(*) FROM sa_job WHERE state = 'succeeded'"
STATS = """
SELECT xact_commit, tup_inserted, tup_updated FROM pg_stat_database WHERE datname = current_database()
"""


@dataclass
class Cell:
    """Per-round results of one (processes, concurrency) pair."""

    procs: int
    concurrency: int
    priced: bool = False
    seconds: list[float] = field(default_factory=list)
    claims: list[float] = field(default_factory=list)
    batches: list[float] = field(default_factory=list)
    commits: list[float] = field(default_factory=list)
    inserted: list[float] = field(default_factory=list)
    updated: list[float] = field(default_factory=list)


def read_stats(url: str) -> tuple[int, int, int]:
    """The database's cumulative commit / insert / update counters (a fresh snapshot)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(STATS).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def round_trips(logs: Sequence[IO[bytes]]) -> tuple[int, int]:
    """Sums the claims and finalize batches the workers reported when they stopped."""
    claims = batches = 0
    for log in logs:
        log.seek(0)
        for line in log:
            if b'"worker.stopped"' in line:
                stopped = json.loads(line)
                claims += stopped["claims"]
                batches += stopped["finalize_batches"]
    return claims, batches


def run_once(cell: Cell, jobs: int, provider_port: int) -> None:
    """One burn-down on a fresh database; appends its figures to `cell`."""
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile()) for _ in range(cell.procs)]
        url = stack.enter_context(scratch_database())
        provider = spawn([str(VENV_BIN / "sa-core"), "fake-provider", "--port", str(provider_port)], {})
        workers = []
        try:
            wait_http(f"http://127.0.0.1:{provider_port}/healthz")
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(BACKLOG, (jobs,))
            time.sleep(1.0)  # let the backlog's backend flush its counters
            before = read_stats(url)
            env = {"DATABASE_URL": url, "SA_PROVIDER_URL": f"http://127.0.0.1:{provider_port}"}
            if cell.priced:
                env.update(_PRICED_ENV, SA_PROVIDER_ROUTES=json.dumps({"routes": [{
                    "name": "priced", "base_url": env["SA_PROVIDER_URL"], "models": ["bench"],
                    "prices": {"input": 2.5, "output": 10}}]}))
            polls = 0
            with psycopg.connect(url, autocommit=True) as poller:
                started = time.monotonic()
                workers = [subprocess.Popen([str(VENV_BIN / "sa-core"), "run-worker", "--concurrency",
                                             str(cell.concurrency)], cwd=REPO, env={**os.environ, **env},
                                            stdout=subprocess.DEVNULL, stderr=log) for log in logs]
                while True:
                    row = poller.execute(DONE).fetchone()
                    polls += 1
                    if row is not None and row[0] >= jobs:
                        break
                    time.sleep(0.05)
                elapsed = time.monotonic() - started
            for proc in workers:
                proc.terminate()
            for proc in workers:
                proc.wait(timeout=60)
            time.sleep(1.0)  # exiting backends flush their counters
            after = read_stats(url)
        finally:
            for proc in [*workers, provider]:
                if proc.poll() is None:
                    proc.terminate()
            for proc in [*workers, provider]:
                proc.wait(timeout=60)
        claims, batches = round_trips(logs)
    # Subtract this script's polls and the `before` read (each one commit).
    cell.seconds.append(elapsed)
    cell.claims.append(claims / jobs)
    cell.batches.append(batches / jobs)
    cell.commits.append((after[0] - before[0] - polls - 1) / jobs)
    cell.inserted.append((after[1] - before[1]) / jobs)
    cell.updated.append((after[2] - before[2]) / jobs)


_PRICED_ENV = {"SA_PROVIDER_MODEL": "bench", "SA_ORG_BUDGET_DAILY": "1000000"}
"""With --priced: the jobs' model (they name none) is the priced route's, and a budget is set."""


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def table(cells: Sequence[Cell], jobs: int) -> str:
    """Formats the cells in bench/peers.py's style (medians over rounds)."""
    head = ["procs", "concurrency", "priced", "seconds", "jobs/s", "claims/job", "batches/job", "commits/job",
            "inserts/job", "updates/job"]
    lines = [head]
    med = statistics.median
    for c in cells:
        seconds = med(c.seconds)
        lines.append([str(c.procs), str(c.concurrency), "yes" if c.priced else "no",
                      f"{seconds:.2f}", f"{jobs / seconds:,.0f}",
                      f"{med(c.claims):.3f}", f"{med(c.batches):.3f}", f"{med(c.commits):.2f}",
                      f"{med(c.inserted):.2f}", f"{med(c.updated):.2f}"])
    return format_table(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--procs", default="1,4", help="worker processes, comma-separated")
    parser.add_argument("--concurrency", default="1,8,32", help="--concurrency per worker, comma-separated")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--priced", default="0",
                        help="0 and/or 1, comma-separated: without and with prices and a budget")
    parser.add_argument("--provider-port", type=int, default=8766)
    args = parser.parse_args()
    cells = [Cell(p, c, bool(priced)) for p in _ints(args.procs) for c in _ints(args.concurrency)
             for priced in _ints(args.priced)]
    for round_no in range(1, args.rounds + 1):
        for cell in cells:
            run_once(cell, args.jobs, args.provider_port)
            print(f"round {round_no} procs {cell.procs} concurrency {cell.concurrency} "
                  f"priced {cell.priced}: "
                  f"{cell.seconds[-1]:.2f} s, {args.jobs / cell.seconds[-1]:,.0f} jobs/s, "
                  f"{cell.claims[-1] + cell.batches[-1]:.3f} round trips/job, "
                  f"{cell.commits[-1]:.2f} commits/job", flush=True, file=sys.stderr)
    print(f"{args.jobs} queued prompts burnt down by `sa-core run-worker` against `sa-core fake-provider`; "
          f"median of {args.rounds} interleaved round(s)")
    print()
    print(table(cells, args.jobs))
    print()
    print("seconds: worker start (start-up included) -> all jobs succeeded. claims/job and batches/job:")
    print("the workers' claim statements and finalize batches per job (their database round trips).")
    print("commits/job: pg_stat_database xact_commit delta / jobs (this script's polls excluded),")
    print("including each LISTENing worker's notification reads.")


if __name__ == "__main__":
    main()
