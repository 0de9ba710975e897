"""POST /prompt through the Procfile's gunicorn at fixed offered rates: achieved rate, p50/p99/max.

Usage: .venv/bin/python -m bench.enqueue_rates [--rates 100,300,1000,max] [--seconds 5]
       [--warmup 1] [--rounds 1] [--open-connections 64] [--connections 32] [--generators 1]

gunicorn runs exactly as the Procfile's `web:` line (service/gunicorn_conf.py: gevent, 2 processes)
on a scratch database. The load comes from separate generator processes (this module with
`--generate`), so no generator shares a GIL with this script or the server. A generator is one
thread driving keep-alive sockets with a selector and prepared request bytes: it costs a few
tens of microseconds of CPU per request, so it leaves the shared cores to the server.

- A number is an open-loop rate: request i is scheduled at t0 + i/rate and sent on whichever of
  `--open-connections` keep-alive connections is free (queued until one is); latency runs from
  the SCHEDULED time, so a slow answer that delays later sends is charged to them (no
  coordinated omission). Achieved rate = answers to the measured requests / (last answer - window
  start).
- `max` is closed-loop: `--connections` keep-alive connections send back to back; latency is each
  request's own round trip, achieved rate = answers / window.

Each rate runs `--warmup` s (not measured) then `--seconds` s. With `--rounds` > 1 the rates are
interleaved (100 300 1000 max, 100 300 ...) and the table shows the median of per-round figures
(max ms: the largest of any round). Before the table, the generator is checked against
GET /healthz (no database) at the highest fixed rate: if it cannot reach that rate, the
rows at or above it measure the generator, not the server; use `--generators 2`. The same check
gives the web's CPU per request for a request that reaches no database and writes no log line:
what gunicorn, gevent, Falcon and the middleware cost before a POST does any work.

Each row also shows the CPU time per answered request of the generator(s), the web processes
and the bench database's Postgres backends (read from /proc; "-" when the server is remote).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import math
import os
import re
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.common import REPO, bench_token, format_table, percentile, scratch_database, web_server

PROMPT = "/sa-core/v1/prompt"
CPU_COLUMNS = ("gen", "web", "pg")


# --- generator (child process) ---------------------------------------------------------------

# NOTE: the generator shares the machine's cores with the server, so it must cost far less CPU per
# request than the server does: httpx spent ~450 us per request (more than half a gunicorn
# worker's budget at 1,000/s), a raw keep-alive socket with a prepared request a few tens of us.
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*([0-9]+)", re.IGNORECASE)
_READ_SIZE = 65536


def _response_size(buf: bytearray) -> tuple[int, int] | None:
    """Returns (status, bytes) of the complete response at the start of `buf`, or None yet.

    The server answers every request with a Content-Length (Falcon sets it), so no chunked
    decoding is needed; a response without one is taken to have an empty body.
    """
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    match = _CONTENT_LENGTH.search(buf, 0, head_end)
    total = head_end + 4 + (int(match.group(1)) if match else 0)
    if len(buf) < total:
        return None
    return int(buf[9:12]), total


class _Connection:
    """One keep-alive connection: its socket, unread bytes, and the times of its request."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.buf = bytearray()
        self.out = b""
        self.scheduled = 0.0
        self.sent = 0.0
        self.busy = False
        self.sock = self._open()

    def _open(self) -> socket.socket:
        sock = socket.create_connection(self.address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        return sock


class Connections:
    """Keep-alive connections driven by one selector loop: no thread, no per-request object.

    `idle` is first in, first out, so every connection is used in turn and none sits idle long
    enough for the server's keep-alive timeout (gunicorn's is 2 s) to close it under load.
    """

    def __init__(self, address: tuple[str, int], count: int) -> None:
        self._selector = selectors.DefaultSelector()
        self.idle = collections.deque(_Connection(address) for _ in range(count))
        self.busy = 0
        for conn in self.idle:
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)

    def send(self, conn: _Connection, request: bytes) -> None:
        """Starts `request` on an idle connection (the caller took it from `idle`)."""
        self.busy += 1
        conn.busy = True
        conn.sent = time.perf_counter()
        try:
            written = conn.sock.send(request)
        except BlockingIOError:
            written = 0
        except OSError:
            self._reopen(conn)
            written = conn.sock.send(request)
        if written < len(request):
            conn.out = request[written:]
            self._selector.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def poll(self, timeout: float | None) -> list[tuple[_Connection, int | None]]:
        """Waits up to `timeout` s; returns (connection, status or None if it failed) per answer.

        Answered connections are NOT put back in `idle`; the caller does it.
        """
        done: list[tuple[_Connection, int | None]] = []
        for key, events in self._selector.select(timeout):
            conn: _Connection = key.data
            if events & selectors.EVENT_WRITE and conn.out:
                conn.out = conn.out[conn.sock.send(conn.out):]
                if not conn.out:
                    self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
            if not events & selectors.EVENT_READ:
                continue
            try:
                data = conn.sock.recv(_READ_SIZE)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                # NOTE: closed by the server: an idle connection (keep-alive timeout) is simply
                # reopened; for a busy one, the request in flight failed.
                self._reopen(conn)
                if conn.busy:
                    self._finish(conn)
                    done.append((conn, None))
                continue
            conn.buf += data
            answer = _response_size(conn.buf)
            if answer is not None:
                del conn.buf[:answer[1]]
                self._finish(conn)
                done.append((conn, answer[0]))
        return done

    def _finish(self, conn: _Connection) -> None:
        conn.busy = False
        self.busy -= 1

    def _reopen(self, conn: _Connection) -> None:
        self._selector.unregister(conn.sock)
        conn.sock.close()
        conn.buf.clear()
        conn.out = b""
        conn.sock = conn._open()
        self._selector.register(conn.sock, selectors.EVENT_READ, conn)


def request_maker(base: str, path: str, token: str) -> tuple[tuple[str, int], Callable[[int], bytes]]:
    """Returns the server address and a function building request i's bytes from a prepared head."""
    host, _, port = base.removeprefix("http://").partition(":")
    address = (host, int(port or 80))
    common = f"Host: {host}:{address[1]}\r\nAuthorization: Bearer {token}\r\n"
    if path != PROMPT:
        get = f"GET {path} HTTP/1.1\r\n{common}\r\n".encode()
        return address, lambda i: get
    head = f"POST {path} HTTP/1.1\r\n{common}Content-Type: application/json\r\n".encode()

    def post(i: int) -> bytes:
        body = b'{"text":"bench %d"}' % i
        return b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)

    return address, post


class _CpuWindow:
    """This process's CPU seconds between two instants, sampled by the loop as it passes them."""

    def __init__(self, start: float, end: float) -> None:
        self._bounds = (start, end)
        self._marks: list[float] = []

    def mark(self, now: float) -> None:
        """Samples the CPU clock when `now` has passed the next bound."""
        if len(self._marks) < 2 and now >= self._bounds[len(self._marks)]:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            self._marks.append(usage.ru_utime + usage.ru_stime)

    def seconds(self) -> float:
        """CPU seconds spent inside the window (up to now if its end was not reached)."""
        if not self._marks:
            return 0.0
        self.mark(math.inf)
        return self._marks[-1] - self._marks[0]


def _open_loop(base: str, path: str, token: str, rate: float, start: float, warmup: float,
               seconds: float, connections: int, index: int, stride: int) -> dict[str, Any]:
    """Sends requests index, index+stride, ... at start + i/rate; latency from the schedule.

    A request that is due while every connection is busy waits in a queue, and its wait counts
    in its latency (no coordinated omission).
    """
    end = start + warmup + seconds
    window = start + warmup
    expected = 200 if path != PROMPT else 202
    address, make = request_maker(base, path, token)
    pool = Connections(address, connections)
    pending: collections.deque[tuple[int, float]] = collections.deque()
    latencies: list[float] = []
    lags: list[float] = []
    errors = 0
    last_done = window
    cpu = _CpuWindow(window, end)
    i = index
    while True:
        now = time.perf_counter()
        cpu.mark(now)
        while (scheduled := start + i / rate) <= now and scheduled < end:
            pending.append((i, scheduled))
            i += stride
        while pending and pool.idle:
            due, due_at = pending.popleft()
            conn = pool.idle.popleft()
            conn.scheduled = due_at
            pool.send(conn, make(due))
        if scheduled >= end and not pending and not pool.busy:
            break
        # NOTE: epoll rounds the timeout up to whole milliseconds, so a send is never early.
        timeout = min(max(scheduled - time.perf_counter(), 0.0), 1.0) if scheduled < end else 1.0
        for conn, status in pool.poll(timeout):
            pool.idle.append(conn)
            done = time.perf_counter()
            if conn.scheduled < window:
                continue
            lags.append((conn.sent - conn.scheduled) * 1000)
            last_done = max(last_done, done)
            if status == expected:
                latencies.append((done - conn.scheduled) * 1000)
            else:
                errors += 1
    answered = len(latencies) + errors
    return {"latencies": latencies, "errors": errors, "answered": answered,
            "elapsed": last_done - window, "lag_p99": percentile(lags, 99) if lags else 0.0,
            "cpu": cpu.seconds()}


def _closed_loop(base: str, path: str, token: str, start: float, warmup: float, seconds: float,
                 connections: int) -> dict[str, Any]:
    """`connections` connections send back to back; counts answers completed inside the window."""
    window = start + warmup
    end = window + seconds
    expected = 200 if path != PROMPT else 202
    address, make = request_maker(base, path, token)
    pool = Connections(address, connections)
    latencies: list[float] = []
    errors = 0
    cpu = _CpuWindow(window, end)
    n = itertools.count()
    delay = start - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    while True:
        now = time.perf_counter()
        cpu.mark(now)
        if now < end:
            while pool.idle:
                pool.send(pool.idle.popleft(), make(next(n)))
        elif not pool.busy:
            break
        for conn, status in pool.poll(1.0):
            pool.idle.append(conn)
            done = time.perf_counter()
            if conn.sent < window or done > end:
                continue
            if status == expected:
                latencies.append((done - conn.sent) * 1000)
            else:
                errors += 1
    return {"latencies": latencies, "errors": errors, "answered": len(latencies) + errors,
            "elapsed": seconds, "lag_p99": 0.0, "cpu": cpu.seconds()}


def generate(args: argparse.Namespace) -> None:
    """Child entry point: runs one rate and prints its raw result as JSON on stdout."""
    token = os.environ["SA_BENCH_TOKEN"]
    # The parent hands over a wall-clock start; turn it into this process's perf_counter.
    start = time.perf_counter() + (args.start_at - time.time())
    if args.rate == "max":
        result = _closed_loop(args.base, args.path, token, start, args.warmup, args.seconds,
                              args.connections)
    else:
        result = _open_loop(args.base, args.path, token, float(args.rate), start, args.warmup,
                            args.seconds, args.open_connections, args.index, args.stride)
    print(json.dumps(result))


# --- driver ----------------------------------------------------------------------------------


@dataclass
class Row:
    """Per-round figures of one offered rate."""

    rate: str
    achieved: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    worst: float = 0.0
    errors: int = 0
    requests: int = 0
    cpu_us: dict[str, list[float]] = field(default_factory=dict)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# NOTE: only the backends of the bench's own database: the other tenants of the server, and
# its background writers (WAL, checkpoints), are left out.
_BACKENDS = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"


def _proc_cpu(pids: Iterable[int]) -> dict[int, float]:
    """CPU seconds (user + system) used so far by each process still alive, read from /proc."""
    cpu: dict[int, float] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited, or not on this machine
        cpu[pid] = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return cpu


def _children(parent: int) -> list[int]:
    """The pids whose parent is `parent` (gunicorn's worker processes)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(stat.parent.name))
    return found


class ServerCpu:
    """CPU seconds of the web processes (gunicorn master and workers) and of the database's
    backends between two samples; a backend that appears in between counts from its start."""

    def __init__(self, web_pid: int, conn: psycopg.Connection[Any]) -> None:
        self._web = [web_pid, *_children(web_pid)]
        self._conn = conn
        self._start: tuple[dict[int, float], dict[int, float]] = ({}, {})

    def _backends(self) -> list[int]:
        return [pid for (pid,) in self._conn.execute(_BACKENDS).fetchall()
                if pid != self._conn.info.backend_pid]

    def start(self) -> None:
        """Takes the first sample."""
        self._start = (_proc_cpu(self._web), _proc_cpu(self._backends()))

    def stop(self) -> dict[str, float]:
        """Returns {"web": s, "pg": s} since `start`; "pg" is absent when no backend is local."""
        web, pg = _proc_cpu(self._web), _proc_cpu(self._backends())
        used = {"web": sum(t - self._start[0].get(pid, 0.0) for pid, t in web.items())}
        if pg:
            used["pg"] = sum(t - self._start[1].get(pid, 0.0) for pid, t in pg.items())
        return used


def _sleep_until(wall: float) -> None:
    delay = wall - time.time()
    if delay > 0:
        time.sleep(delay)


def run_rate(args: argparse.Namespace, base: str, token: str, rate: str, server: ServerCpu,
             path: str = PROMPT) -> dict[str, Any]:
    """Runs one rate with `--generators` child processes and merges their results.

    CPU figures are per answered request, over the measured window only.
    """
    n = args.generators
    start_at = time.time() + 1.0  # the children need well under a second to import and connect
    procs = []
    for k in range(n):
        cmd = [sys.executable, "-m", "bench.enqueue_rates", "--generate", "--base", base,
               "--path", path, "--rate", rate, "--start-at", repr(start_at), "--warmup",
               str(args.warmup), "--seconds", str(args.seconds), "--index", str(k), "--stride",
               str(n), "--open-connections", str(max(1, args.open_connections // n)),
               "--connections", str(max(1, args.connections // n))]
        procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                                      env={**os.environ, "SA_BENCH_TOKEN": token}))
    _sleep_until(start_at + args.warmup)
    server.start()
    _sleep_until(start_at + args.warmup + args.seconds)
    used = server.stop()
    parts = []
    for proc in procs:
        out, _ = proc.communicate(timeout=args.warmup + args.seconds + 120)
        if proc.returncode != 0:
            raise SystemExit(f"generator exited {proc.returncode}")
        parts.append(json.loads(out))
    latencies = [x for p in parts for x in p["latencies"]]
    answered = sum(p["answered"] for p in parts)
    elapsed = max(p["elapsed"] for p in parts)
    used["gen"] = sum(p["cpu"] for p in parts)
    return {"latencies": latencies, "errors": sum(p["errors"] for p in parts),
            "answered": answered, "achieved": answered / elapsed if elapsed > 0 else 0.0,
            "lag_p99": max(p["lag_p99"] for p in parts),
            "cpu_us": {name: seconds * 1e6 / answered for name, seconds in used.items()
                       if answered}}


def table(rows: list[Row]) -> str:
    """Formats the rows in bench/peers.py's style."""
    head = ["offered/s", "achieved/s", "p50 ms", "p99 ms", "max ms", "errors", "requests",
            *(f"{name} us/req" for name in CPU_COLUMNS)]
    lines = [head]
    for r in rows:
        med = statistics.median
        lines.append([r.rate if r.rate == "max" else f"{float(r.rate):,.0f}",
                      f"{med(r.achieved):,.0f}" if r.achieved else "-",
                      f"{med(r.p50):.1f}" if r.p50 else "-", f"{med(r.p99):.1f}" if r.p99 else "-",
                      f"{r.worst:.1f}", str(r.errors), f"{r.requests:,}",
                      *(f"{med(r.cpu_us[name]):,.0f}" if r.cpu_us.get(name) else "-"
                        for name in CPU_COLUMNS)])
    return format_table(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="100,300,1000,max")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--open-connections", type=int, default=64,
                        help="open-loop keep-alive connections (all generators)")
    parser.add_argument("--connections", type=int, default=32, help="closed-loop clients for `max`")
    parser.add_argument("--generators", type=int, default=1, help="load generator processes")
    parser.add_argument("--port", type=int, default=8765)
    # generator child only
    parser.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--base", help=argparse.SUPPRESS)
    parser.add_argument("--path", default=PROMPT, help=argparse.SUPPRESS)
    parser.add_argument("--rate", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--stride", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        generate(args)
        return
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    rows = [Row(rate) for rate in rates]
    fixed = [float(r) for r in rates if r != "max"]
    with (scratch_database() as url, psycopg.connect(url, autocommit=True) as conn,
          web_server({"DATABASE_URL": url}, args.port) as web):
        token = bench_token(url)
        server = ServerCpu(web.pid, conn)
        base = f"http://127.0.0.1:{args.port}"
        check = None
        if fixed:
            check = run_rate(args, base, token, str(max(fixed)), server, path="/healthz")
        for round_no in range(1, args.rounds + 1):
            for row in rows:
                res = run_rate(args, base, token, row.rate, server)
                lat = res["latencies"]
                row.achieved.append(res["achieved"])
                if lat:
                    row.p50.append(percentile(lat, 50))
                    row.p99.append(percentile(lat, 99))
                    row.worst = max(row.worst, max(lat))
                row.errors += res["errors"]
                row.requests += res["answered"]
                for name, value in res["cpu_us"].items():
                    row.cpu_us.setdefault(name, []).append(value)
                print(f"round {round_no} rate {row.rate}: {res['achieved']:,.0f}/s, "
                      f"p50 {row.p50[-1] if lat else 0:.1f} ms, send lag p99 "
                      f"{res['lag_p99']:.1f} ms", file=sys.stderr, flush=True)
    print(f"POST /prompt through gunicorn per Procfile (gevent, WEB_CONCURRENCY="
          f"{os.environ.get('WEB_CONCURRENCY', '2')}); {args.generators} generator process(es), "
          f"{args.open_connections} open-loop connections, {args.connections} for max; "
          f"{args.warmup:g} s warm-up + {args.seconds:g} s per rate, {args.rounds} round(s)")
    if check is not None:
        verdict = ("reached" if check["achieved"] >= 0.95 * max(fixed)
                   else "NOT reached: that row measures the generator; raise --generators")
        print(f"generator check: GET /healthz at {max(fixed):,.0f}/s offered -> "
              f"{check['achieved']:,.0f}/s, p99 {percentile(check['latencies'], 99):.1f} ms, "
              f"send lag p99 {check['lag_p99']:.1f} ms, generator CPU "
              f"{check['cpu_us'].get('gen', 0.0):.0f} us/request ({verdict}); web CPU "
              f"{check['cpu_us'].get('web', 0.0):.0f} us/request (the server's floor: no "
              "database, no log line)")
    print()
    print(table(rows))
    print()
    print("latency from the scheduled send time (open loop; max: closed loop, per request); "
          f"p50/p99: median of {args.rounds} round(s); errors: answers other than 202 or no answer.")
    print("us/req: CPU per answered request in the measured window, of the generator(s), the web "
          "(gunicorn master and workers) and the bench database's Postgres backends.")


if __name__ == "__main__":
    main()
