"""LLM-shaped load: one worker process holding many provider calls that each take a second.

Usage: .venv/bin/python -m bench.llm_shaped [--inflight 64,256,1024,2048] [--seconds 8]
       [--latency 1.0] [--stream 0] [--only sa-core,sa-core-threads,pgqueuer,oban]
       .venv/bin/python -m bench.llm_shaped --workers 3 --inflight 30000 --latency 30 --seconds 90
       [--provider-procs 3] [--provider-addresses 1] [--source-addresses 3] [--repeat 1]

One provider (bench/slow_provider.py: raw asyncio, answers every call after `--latency`
seconds) serves every run. For each in-flight count C, each contender gets a fresh database
with max(512, C x seconds / latency) jobs queued, then one worker process at concurrency C
burns them down while each job makes one chat-completion call: sa-core is the real
`sa-core run-worker --concurrency C` (full jobs: response entity, ledger, events; under gevent,
jobqueue/runtime/green.py), sa-core-threads the same command left on OS threads, pgqueuer and
oban run their worker with a task that makes the same call through aiohttp (bench/peers.py's
runners and cached virtual environments, `llm` mode). Printed per run: jobs/s, jobs/s as a
fraction of the ideal C / latency, the worker's CPU per job and peak RSS, and jobs/s against
sa-core's at the same C. sa-core's CPU and RSS are its worker process's alone; a peer runs
worker and enqueuer in one process, so its figures cover the burn-down part of that process.

`--latency S` is how long each call takes; `--stream N` (sa-core only) makes the provider stream
each answer as N chunks spread over those S seconds and the worker's route ask for streamed
answers, so every job writes its text while it arrives (SA_STREAM_INTERVAL): the cost of
streaming is the CPU per job against a run without `--stream`.

`--workers N` is the multi-process mode (bench/llm_fleet.py): sa-core only, one in-flight count
shared by N worker processes, the provider on several processes and addresses, measured in
steady state over `--seconds` from the first answer.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import subprocess
import sys
from typing import Any

import structlog

from bench.common import format_table, start_slow_provider
from bench.llm_fleet import add_arguments, run_fleet
from bench.peers import Contender, contenders, machine_header, prepare, run_once
from jobqueue.devtools.embedded_db import admin_conninfo

__all__ = ["main"]

CONTENDERS = ("sa-core", "sa-core-threads", "pgqueuer", "oban")
# NOTE: the worker as it ran before gevent (an OS thread per slot), for the model comparison.
THREADS = Contender("sa-core-threads", None, "bench.peer_runners.sa_core", migrated=True,
                    extra=("--variant", "threads"))


def run(rows: list[Contender], counts: list[int], url: str, args: argparse.Namespace) -> list[list[str]]:
    """Every contender at every in-flight count; returns the table's rows."""
    table = [["in flight", "contender", "jobs", "jobs/s", "of C/latency", "CPU ms/job",
              "peak RSS MiB", "vs sa-core"]]
    for inflight in counts:
        jobs = max(512, int(inflight * args.seconds / args.latency))
        base: float | None = None
        for contender in rows:
            if contender.error:
                table.append([str(inflight), contender.name, str(jobs), "-", contender.error[:60],
                              "", "", ""])
                continue
            stream = ("--stream",) if args.stream else ()
            runner = dataclasses.replace(contender, extra=(*contender.extra, "--provider-url", url,
                                                           *stream))
            run_args = argparse.Namespace(concurrency=inflight, timeout=args.timeout, pickup_budget=0)
            print(f"[load {os.getloadavg()[0]:.1f}] {contender.name} at {inflight} in flight, "
                  f"{jobs} jobs ...", file=sys.stderr, flush=True)
            try:
                result: dict[str, Any] = run_once(runner, "llm", jobs, run_args)
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                table.append([str(inflight), contender.name, str(jobs), "failed", str(exc)[:60],
                              "", "", ""])
                continue
            rate = result["jobs_per_s"]
            if contender.name == "sa-core":
                base = rate
            table.append([str(inflight), contender.name, str(jobs), f"{rate:,.0f}",
                          f"{rate * args.latency / inflight:.0%}",
                          f"{result['worker_cpu_s'] * 1000 / jobs:.2f}",
                          f"{result['peak_rss_mib']:.0f}",
                          f"{rate / base:.2f}x" if base else "-"])
            print("  " + "  ".join(table[-1][3:]), file=sys.stderr, flush=True)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inflight", default="64,256,1024,2048")
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="jobs per run = in flight x seconds / latency (at least 512)")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds each call takes")
    parser.add_argument("--stream", type=int, default=0,
                        help="chunks per streamed answer (sa-core only; 0: answers are not streamed)")
    parser.add_argument("--only", default=",".join(CONTENDERS))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per child run")
    parser.add_argument("--reinstall", action="store_true", help="rebuild the cached venvs")
    add_arguments(parser)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    if args.workers:
        args.inflight = int(args.inflight)
        run_fleet(args)
        return
    known = {c.name: c for c in [*contenders(), THREADS] if c.name in CONTENDERS}
    rows = [known[name.strip()] for name in args.only.split(",") if name.strip()]
    if args.stream and any(not row.name.startswith("sa-core") for row in rows):
        parser.error("--stream measures sa-core only (--only sa-core,sa-core-threads)")
    prepare(rows, args.reinstall)
    counts = [int(n) for n in args.inflight.split(",")]
    provider, url = start_slow_provider(args.latency, args.stream)
    try:
        header = machine_header(admin_conninfo("SA_BENCH_DATABASE_URL"))
        header += [f"{c.name}: " + ", ".join(f"{k} {v}" for k, v in c.versions.items())
                   for c in rows if c.versions]
        streamed = f", streamed as {args.stream} chunks" if args.stream else ""
        header.append(f"provider: bench/slow_provider.py answering after {args.latency:g} s"
                      f"{streamed}; one worker process per run")
        print("\n".join(header) + "\n", flush=True)
        table = run(rows, counts, url, args)
    finally:
        provider.terminate()
        provider.wait(timeout=10)
    print(format_table(table, left=2))


if __name__ == "__main__":
    main()
