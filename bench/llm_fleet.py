"""bench/llm_shaped.py's multi-process mode: one host, several worker processes, one provider spread
over several processes and addresses, measured in steady state.

Usage: .venv/bin/python -m bench.llm_shaped --workers 3 --inflight 30000 --latency 30 --seconds 90
       [--provider-procs 3] [--provider-addresses 1] [--source-addresses 3] [--repeat 1]

Past one process and one address: a process may hold at most `ulimit -Hn` descriptors and one
source address reaches one provider address and port over at most the ephemeral range
(`net.ipv4.ip_local_port_range`). So C calls in flight run as `--workers` real `sa-core run-worker
--concurrency C/W` processes (each raising its soft descriptor limit to the hard one) against
`--provider-procs` bench/slow_provider.py processes that all listen on the same port of
`--provider-addresses` addresses 127.0.0.1, 127.0.0.2, ... (SO_REUSEPORT: the kernel spreads the
connections over the processes; worker i is given address i mod A). `--source-addresses S` sets
every worker's SA_PROVIDER_SOURCE_ADDRESSES to 127.0.1.1 ... 127.0.1.S (0: unset, the kernel's
choice), which is what lets more than one range of connections reach one provider address.

One fresh database holds C x (2 + seconds / latency) queued jobs, written in one statement per
50,000 before the workers start. The window opens at the first `succeeded` event (one latency
after the start) and lasts `--seconds` (a multiple of the latency keeps whole rounds); jobs/s is
the `succeeded` events stamped inside it, against the ideal C / latency. Printed per run: jobs/s
and its fraction of the ideal, worker CPU per job over the window (and the providers', and that
of the Postgres backends serving the workers' sessions, WAL writer and checkpointer aside), the
workers' RSS summed at the window's end (and how much it grew during the window), the provider connections by
source address and the Postgres connections each worker process holds (both read from /proc: the
processes' sockets in /proc/net/tcp), the database's sessions in pg_stat_activity, the attempts
that failed inside the window, and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from bench.common import BACKLOG, REPO, VENV_BIN, format_table, scratch_database
from bench.peers import as_uri

__all__ = ["add_arguments", "run_fleet"]

_CHUNK = 50_000
# NOTE: stamped by the finalize (clock_timestamp()), so the window is the database's view.
_SUCCEEDED_IN = """
SELECT count(*) FROM sa_job_event
 WHERE to_state = 'succeeded' AND at >= to_timestamp(%(start)s) AND at < to_timestamp(%(end)s)
"""
_FAILED_IN = """
SELECT count(*) FROM sa_job_event
 WHERE from_state = 'running' AND to_state IN ('queued', 'failed')
   AND at >= to_timestamp(%(start)s) AND at < to_timestamp(%(end)s)
"""
_FIRST_SUCCESS = "SELECT extract(epoch FROM min(at))::float8 FROM sa_job_event WHERE to_state = 'succeeded'"
_TOP_ERROR = """
SELECT error_message, count(*) AS n FROM sa_job WHERE error_message IS NOT NULL
 GROUP BY 1 ORDER BY n DESC LIMIT 1
"""
_SESSIONS = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
# NOTE: the workers' sessions are pooled and kept, so their backends live through the window.
_BACKENDS = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
             "AND pid <> pg_backend_pid()")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The multi-process mode's options (on bench/llm_shaped.py's parser)."""
    parser.add_argument("--workers", type=int, default=0,
                        help="multi-process mode: this many worker processes share --inflight")
    parser.add_argument("--provider-procs", type=int, default=3,
                        help="multi-process mode: provider processes (SO_REUSEPORT)")
    parser.add_argument("--provider-addresses", type=int, default=1,
                        help="multi-process mode: addresses the provider listens on")
    parser.add_argument("--source-addresses", type=int, default=3,
                        help="multi-process mode: SA_PROVIDER_SOURCE_ADDRESSES per worker (0: unset)")
    parser.add_argument("--repeat", type=int, default=1, help="multi-process mode: runs")


@dataclass
class _Usage:
    """CPU seconds and resident MiB of a set of processes at one moment."""

    cpu_s: float
    rss_mib: float


def _cpu(pids: Sequence[int]) -> dict[int, float]:
    """CPU seconds so far of each process still there."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
            found[pid] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def _usage(pids: Sequence[int]) -> _Usage:
    cpu = sum(_cpu(pids).values())
    rss = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) / 1024
    return _Usage(cpu, rss)


def _tcp_peers(pid: int) -> list[tuple[str, int, str, int]]:
    """The process's established IPv4 TCP sockets: (local address, port, remote address, port)."""
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            link = os.readlink(f"{fd_dir}/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    found = []
    with open(f"/proc/{pid}/net/tcp") as table:
        next(table)
        for line in table:
            parts = line.split()
            if parts[3] != "01" or parts[9] not in inodes:
                continue
            (local, lport), (remote, rport) = (_address(p) for p in parts[1:3])
            found.append((local, lport, remote, rport))
    return found


def _address(hex_address: str) -> tuple[str, int]:
    host, port = hex_address.split(":")
    return socket.inet_ntoa(bytes.fromhex(host)[::-1]), int(port, 16)


def _start_providers(args: argparse.Namespace, hosts: list[str]) -> tuple[list[subprocess.Popen[str]], int]:
    procs: list[subprocess.Popen[str]] = []
    port = 0
    for _ in range(args.provider_procs):
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.slow_provider", "--latency", str(args.latency),
             "--stream", str(args.stream), "--host", ",".join(hosts), "--port", str(port),
             "--reuse-port"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            _stop(procs, 5)
            raise SystemExit(f"the slow provider did not start: {line!r}")
        port = int(line.split()[-1])
    return procs, port


def _stop(procs: Sequence[subprocess.Popen[Any]],
          grace: float) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def _fleet(args: argparse.Namespace, url: str) -> Iterator[tuple[list[subprocess.Popen[bytes]],
                                                                  list[subprocess.Popen[str]], int]]:
    hosts = [f"127.0.0.{1 + i}" for i in range(args.provider_addresses)]
    sources = ",".join(f"127.0.1.{1 + i}" for i in range(args.source_addresses))
    providers, port = _start_providers(args, hosts)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(args.workers):
            base_url = f"http://{hosts[i % len(hosts)]}:{port}/v1"
            env = {**os.environ, "DATABASE_URL": url, "SA_PROVIDER_URL": base_url,
                   "SA_PROVIDER_SOURCE_ADDRESSES": sources}
            if args.stream:
                env.update(SA_PROVIDER_URL="", SA_PROVIDER_ROUTES=json.dumps(
                    {"routes": [{"name": "streamed", "base_url": base_url, "stream": True}]}))
            # NOTE: a session of its own, so an overrunning run is ended with everything in it.
            workers.append(subprocess.Popen(
                [str(VENV_BIN / "sa-core"), "run-worker", "--concurrency",
                 str(args.inflight // args.workers)],
                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True))
        yield workers, providers, port
    finally:
        # NOTE: the database is thrown away: nothing in flight needs to finish.
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                worker.kill()
            worker.wait()
        _stop(providers, 10)


def _alive(procs: Sequence[subprocess.Popen[Any]]) -> None:
    for proc in procs:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode}")


def _one_run(args: argparse.Namespace) -> list[str]:
    jobs = int(args.inflight * (2 + args.seconds / args.latency))
    with scratch_database() as conninfo, psycopg.connect(conninfo, autocommit=True) as db:
        url = as_uri(conninfo)
        for start in range(0, jobs, _CHUNK):
            db.execute(BACKLOG, (min(_CHUNK, jobs - start),))
        db.execute("ANALYZE")
        print(f"[load {os.getloadavg()[0]:.1f}] {jobs:,} jobs queued; {args.workers} workers x "
              f"{args.inflight // args.workers} ...", file=sys.stderr, flush=True)
        with _fleet(args, url) as (workers, providers, port):
            started = time.time()
            first = None
            while first is None:
                if time.time() - started > args.latency * 3 + 60:
                    raise SystemExit("no job succeeded in time")
                _alive([*workers, *providers])
                time.sleep(0.2)
                first = db.execute(_FIRST_SUCCESS).fetchone()[0]  # type: ignore[index]
            before_w = _usage([w.pid for w in workers])
            before_p = _usage([p.pid for p in providers])
            before_db = _cpu([row[0] for row in db.execute(_BACKENDS).fetchall()])
            loads = [os.getloadavg()[0]]
            end = first + args.seconds
            time.sleep(max(0.0, first + args.seconds / 2 - time.time()))
            sessions = db.execute(_SESSIONS).fetchone()[0]  # type: ignore[index]
            peers = [_tcp_peers(w.pid) for w in workers]
            loads.append(os.getloadavg()[0])
            time.sleep(max(0.0, end - time.time()))
            after_w = _usage([w.pid for w in workers])
            after_p = _usage([p.pid for p in providers])
            after_db = _cpu(list(before_db))
            loads.append(os.getloadavg()[0])
            _alive([*workers, *providers])
            window = {"start": first, "end": end}
            done = db.execute(_SUCCEEDED_IN, window).fetchone()[0]  # type: ignore[index]
            failed = db.execute(_FAILED_IN, window).fetchone()[0]  # type: ignore[index]
            top_error = db.execute(_TOP_ERROR).fetchone()
    by_source = Counter(local for conns in peers for local, _, _, rport in conns if rport == port)
    postgres = [sum(1 for _, _, _, rport in conns if rport == 5432) for conns in peers]
    rate = done / args.seconds
    cpu_ms = (after_w.cpu_s - before_w.cpu_s) * 1000 / max(done, 1)
    provider_ms = (after_p.cpu_s - before_p.cpu_s) * 1000 / max(done, 1)
    db_ms = sum(after_db[pid] - before_db[pid] for pid in after_db) * 1000 / max(done, 1)
    print(f"  provider connections by source: {dict(sorted(by_source.items()))}", file=sys.stderr)
    if top_error is not None:
        print(f"  most frequent error ({top_error[1]} jobs): {top_error[0]}", file=sys.stderr)
    return [f"{args.workers} x {args.inflight // args.workers:,}",
            f"{args.provider_procs} @ {args.provider_addresses}", str(args.source_addresses),
            f"{sum(by_source.values()):,}", f"{rate:,.0f}",
            f"{rate * args.latency / args.inflight:.0%}", f"{cpu_ms:.2f}", f"{provider_ms:.2f}",
            f"{db_ms:.2f}", f"{after_w.rss_mib:,.0f}", f"{after_w.rss_mib - before_w.rss_mib:+,.0f}",
            f"{after_p.rss_mib:,.0f}", "+".join(map(str, postgres)), str(sessions), str(failed),
            "-".join(f"{x:.1f}" for x in loads)]


def run_fleet(args: argparse.Namespace) -> None:
    """Runs the multi-process mode `--repeat` times and prints one row per run."""
    if args.inflight % args.workers:
        raise SystemExit("--inflight must be a multiple of --workers")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        low, high = (int(x) for x in ports.read().split())
    print(f"descriptors per process: soft {soft}, hard {hard}; ephemeral ports {low}-{high} "
          f"({high - low + 1:,} per source address and provider address); "
          f"provider: bench/slow_provider.py answering after {args.latency:g} s; window "
          f"{args.seconds:g} s from the first success. provider: processes @ addresses; "
          "ms/job: CPU; PG conns: each worker's, from /proc", flush=True)
    head = ["workers", "provider", "sources", "provider conns", "jobs/s", "of ideal",
            "worker ms/job", "provider ms/job", "PG ms/job", "workers RSS MiB", "in window",
            "provider MiB", "PG conns", "PG sessions", "failed", "load"]
    rows = [head]
    for _ in range(args.repeat):
        rows.append(_one_run(args))
        print("  " + "  ".join(rows[-1]), file=sys.stderr, flush=True)
    print(format_table(rows, left=2))
