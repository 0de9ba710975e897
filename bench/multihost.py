"""Throughput across worker hosts through PgBouncer, for sizing a deployment; optionally the 60 s cut.

Usage (as root: the hosts are network namespaces, see tests/hosts.py):
    .venv/bin/python -m bench.multihost [--hosts 1,2,4] [--latency 1,0] [--jobs 2000]
        [--concurrency 256] [--cut 0]

For each provider latency and each number of worker hosts: a backlog of `--jobs` queued prompts
(one INSERT) written once one `sa-core run-worker --concurrency C` per host (its own provider,
bench/slow_provider.py, on the host's loopback) has started, every worker querying through this
run's PgBouncer (transaction mode) and LISTENing directly. Time runs from the backlog's commit
until every job succeeded (polled every 0.2 s). Reported per cell: jobs/s; Postgres commits per job
(`pg_stat_database.xact_commit` delta over the jobs, this script's own polls subtracted); and
connections held at the peak: server backends of the database (`pg_stat_activity`), of which
PgBouncer's (its pool, `SHOW POOLS` sv_active + sv_idle + sv_used), and PgBouncer's client
connections (cl_active + cl_waiting). Each cell ends with the exact counts (lost, stuck,
duplicated) that must be 0.

`--cut SECONDS` instead runs the fault of issue 17 at full length: three worker hosts (1 s
provider), a backlog, one host's link down for SECONDS while it holds running jobs, then up;
it prints how long the others took to finish its jobs, how many late finalizes the claim guard
refused, and the exact counts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any

from bench.common import BACKLOG, format_table
from tests.hosts import Hosts

CLEAN = ("TRUNCATE sa_job_event, sa_ledger, sa_audit, sa_edge, sa_job, sa_entity "
         "RESTART IDENTITY CASCADE")
SAMPLE = """
SELECT (SELECT count(*) FILTER (WHERE state = 'succeeded') FROM sa_job) AS succeeded,
       (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
           AND pid <> pg_backend_pid()) AS backends
"""
COMMITS = ("SELECT pg_stat_clear_snapshot(), (SELECT xact_commit FROM pg_stat_database "
           "WHERE datname = current_database()) AS commits")
EXACT = ("lost", "stuck", "ended_otherwise", "duplicated_jobs", "duplicated_responses",
         "ledger_mismatches")
# NOTE: a bench's timings, not the tests' 3 s: production-like heartbeats, a short stale age so
# the cut host's jobs move within the minute.
CUT_SETTINGS = {"SA_HEARTBEAT_INTERVAL": "2", "SA_STALE_AFTER": "10", "SA_RECLAIM_INTERVAL": "2"}


def commits(hosts: Hosts) -> int:
    return int(hosts.sql(COMMITS)[0]["commits"])


def pooler_connections(hosts: Hosts) -> tuple[int, int]:
    """PgBouncer's (server connections, client connections) for the service's database."""
    rows = [r for r in hosts.bouncer.show("POOLS") if r["database"] == "sa_core"]
    server = sum(r["sv_active"] + r["sv_idle"] + r["sv_used"] + r["sv_tested"] + r["sv_login"]
                 for r in rows)
    return server, sum(r["cl_active"] + r["cl_waiting"] for r in rows)


def run_cell(hosts: Hosts, n_hosts: int, latency: float, jobs: int,
             concurrency: int) -> dict[str, Any]:
    hosts.sql(CLEAN)
    workers = [hosts.start_worker(host, latency, concurrency=concurrency)
               for host in hosts.hosts[:n_hosts]]
    peak = {"backends": 0, "server": 0, "clients": 0}
    try:
        # NOTE: timed from the backlog's commit, the workers already up and listening, so
        # start-up (a second or two per process here) is not in the rate.
        while not all(any("worker.started" in line for line in w.lines()) for w in workers):
            time.sleep(0.1)
        before = commits(hosts)
        polls = 2  # the two COMMITS reads
        started = time.monotonic()
        hosts.sql(BACKLOG, (jobs,))
        while True:
            row = hosts.sql(SAMPLE)[0]
            polls += 1
            server, clients = pooler_connections(hosts)
            peak = {"backends": max(peak["backends"], int(row["backends"])),
                    "server": max(peak["server"], server), "clients": max(peak["clients"], clients)}
            if row["succeeded"] >= jobs:
                break
            time.sleep(0.2)
        seconds = time.monotonic() - started
    finally:
        for host in hosts.hosts[:n_hosts]:
            for process in host.processes:
                process.stop()
            host.processes.clear()
    counts = hosts.counts()
    polls += 2  # the backlog and the counts
    # NOTE: a backend reports its counters when it ends (the workers' LISTEN and leader
    # sessions have); PgBouncer's server connections report at least every second.
    time.sleep(1.5)
    spent = commits(hosts) - before - polls
    return {"hosts": n_hosts, "latency": latency, "seconds": seconds, "jobs_s": jobs / seconds,
            "commits_job": spent / jobs, **peak, "exact": {k: counts[k] for k in EXACT},
            "succeeded": counts["succeeded"]}


def run_cut(hosts: Hosts, cut: float, jobs: int) -> None:
    hosts.sql(CLEAN)
    hosts.sql(BACKLOG, (jobs,))
    victim_host, *others = hosts.hosts[:3]
    victim = hosts.start_worker(victim_host, 1.0, concurrency=32, env=CUT_SETTINGS)
    for host in others:
        hosts.start_worker(host, 1.0, concurrency=32, env=CUT_SETTINGS)
    claim = f"%:{victim.popen.pid}:%"
    held: list[dict[str, Any]] = []
    while not held:
        held = hosts.sql("SELECT id FROM sa_job WHERE state = 'running' AND worker_claim LIKE %s",
                         (claim,))
        time.sleep(0.05)
    victim_host.cut()
    cut_at = time.monotonic()
    ids = [r["id"] for r in held]
    moved = reclaimed = None
    while time.monotonic() - cut_at < cut:
        if reclaimed is None and not hosts.sql(
                "SELECT 1 FROM sa_job WHERE id = ANY(%s) AND worker_claim LIKE %s",
                (ids, claim)):
            reclaimed = time.monotonic() - cut_at
        if moved is None and hosts.sql(
                "SELECT bool_and(state = 'succeeded') AS ok FROM sa_job WHERE id = ANY(%s)",
                (ids,))[0]["ok"]:
            moved = time.monotonic() - cut_at
        time.sleep(0.5)
    victim_host.restore()
    while hosts.sql("SELECT count(*) AS n FROM sa_job WHERE state IN ('queued', 'running')")[0]["n"]:
        time.sleep(0.5)
    # NOTE: the cut host's finalizes reach the server at its next TCP retransmission.
    time.sleep(15)
    lost_claims = [json.loads(line) for line in victim.lines() if "job.claim_lost" in line]
    for host in hosts.hosts[:3]:
        for process in host.processes:
            process.stop()
    counts = hosts.counts()
    print(f"cut {cut:g} s: the cut host held {len(held)} running jobs; "
          + (f"requeued {reclaimed:.1f} s into the cut, " if reclaimed is not None else "")
          + (f"all finished by the others {moved:.1f} s into it" if moved is not None else
             "not all finished during the cut"))
    print(f"late finalizes refused by the claim guard: "
          f"{len({e['job_id'] for e in lost_claims} & {str(i) for i in ids})} of {len(held)}")
    print("counts: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", default="1,2,4", help="worker hosts, comma-separated")
    parser.add_argument("--latency", default="1,0", help="provider seconds, comma-separated")
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--cut", type=float, default=0.0,
                        help="run the link-cut fault for this many seconds instead")
    args = parser.parse_args()
    counts = [int(n) for n in args.hosts.split(",")]
    with Hosts(pool_size=20) as hosts:
        for i in range(max(*counts, 3)):
            hosts.add(f"w{i + 1}")
        if args.cut:
            run_cut(hosts, args.cut, args.jobs)
            return
        cells = [run_cell(hosts, n, float(latency), args.jobs, args.concurrency)
                 for latency in args.latency.split(",") for n in counts]
    lines = [["provider", "hosts", "jobs/s", "seconds", "commits/job", "backends",
              "of them pooled", "pooler clients", "lost/stuck/dup"]]
    for c in cells:
        bad = sum(c["exact"].values())
        lines.append([f"{c['latency']:g} s", str(c["hosts"]), f"{c['jobs_s']:,.0f}",
                      f"{c['seconds']:.1f}", f"{c['commits_job']:.2f}", str(c["backends"]),
                      str(c["server"]), str(c["clients"]),
                      "0/0/0" if bad == 0 else json.dumps(c["exact"])])
    print(f"{args.jobs} jobs per cell, --concurrency {args.concurrency} per worker host, through "
          "PgBouncer (transaction mode, default_pool_size 20)")
    print(format_table(lines, left=1))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
