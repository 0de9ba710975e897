"""Round trips of a claim, measured across a link with a fixed latency.

Usage: .venv/bin/python -m bench.claim_round_trips [--delay-ms 10] [--claims 50]

A proxy in this process stands in for a network link (netem is not loaded on these machines):
every chunk read in either direction is passed on `--delay-ms` after it arrived, whatever came
before it, so chunks sent back to back overlap in flight as on a real link (a proxy that slept
before each chunk would serialize them, and count pipelined sends as round trips). Through it:

- `SELECT 1`: one round trip, the unit of the last column;
- `claim()` and `next_due()` as jobqueue.engine.claim runs them (one pipeline, one Sync);
- `four statements`: the claim's former shape, BEGIN, the plan settings, the same claim
  statement, COMMIT, one after the other (for reference).

Each `claim()` takes one job of a backlog enqueued beforehand. Prints the median and p99 of each,
and the median in round trips (median / `SELECT 1`'s median).
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from bench.common import format_table, percentile, scratch_database
from jobqueue.core.db import DictConnection, open_pool
from jobqueue.core.queries import claim as claim_q
from jobqueue.core.queries import job as job_q
from jobqueue.core.tokens import Caller
from jobqueue.engine.claim import DEFAULT_DEPTH, claim, next_due
from jobqueue.engine.enqueue import enqueue


class LatencyLink:
    """A TCP forwarder to `target` that delivers each chunk `delay` seconds after it arrived."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.target = target
        self.delay = delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for src, dst in ((client, upstream), (upstream, client)):
                self._direction(src, dst)

    def _direction(self, src: socket.socket, dst: socket.socket) -> None:
        due: list[tuple[float, int, bytes]] = []
        ready = threading.Condition()
        seq = 0

        def read() -> None:
            nonlocal seq
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    with ready:
                        heapq.heappush(due, (time.monotonic() + self.delay, seq, data))
                        seq += 1
                        ready.notify()
            with ready:
                heapq.heappush(due, (time.monotonic() + self.delay, seq, b""))
                ready.notify()

        def write() -> None:
            while True:
                with ready:
                    while not due or due[0][0] > time.monotonic():
                        ready.wait(None if not due else due[0][0] - time.monotonic())
                    _, _, data = heapq.heappop(due)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                try:
                    dst.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def close(self) -> None:
        self.listener.close()


def select_one(pool: ConnectionPool[DictConnection]) -> None:
    with pool.connection() as conn:
        conn.execute("SELECT 1")


def four_statements(pool: ConnectionPool[DictConnection], worker: str) -> list[dict[str, Any]]:
    """The claim as it was: BEGIN, the plan settings, the claim, COMMIT, each awaited."""
    params = {"claim": worker, "limit": 1, "ceiling": 100, "org_cap": 0,
              "default_depth": DEFAULT_DEPTH, "aging": 300.0, "held_orgs": [], "token_window": 0.0}
    with pool.connection() as conn, conn.transaction():
        conn.execute(job_q.JOB_PLAN_SETTINGS)
        return conn.execute(claim_q.JOB_CLAIM_MANY, params).fetchall()


def timed(work: Callable[[], object], runs: int) -> list[float]:
    """Milliseconds each of `runs` calls of `work` took."""
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        out.append((time.perf_counter() - started) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay-ms", type=float, default=10.0, help="one way, each direction")
    parser.add_argument("--claims", type=int, default=50)
    args = parser.parse_args()
    with scratch_database() as url:
        direct = open_pool(url, name="bench-direct", max_size=1)
        for i in range(2 * args.claims + 10):
            enqueue(direct, Caller(org_id=1 + i % 3, user_id=1), f"round trips {i}")
        parts = conninfo_to_dict(url)
        link = LatencyLink((str(parts.get("host", "127.0.0.1")), int(parts.get("port", 5432))),
                           args.delay_ms / 1000)
        far = open_pool(make_conninfo(url, host="127.0.0.1", port=str(link.port)),
                        name="bench-far", max_size=1)
        try:
            # NOTE: one untimed run of each first, so connection and planning costs stay out.
            rows: dict[str, list[float]] = {}
            cases: list[tuple[str, Callable[[], object]]] = [
                ("SELECT 1", lambda: select_one(far)),
                ("claim()", lambda: claim(far, "bench", 1, 100)),
                ("next_due()", lambda: next_due(far, 100)),
                ("four statements", lambda: four_statements(far, "bench-old")),
            ]
            for name, work in cases:
                work()
                rows[name] = timed(work, args.claims)
        finally:
            far.close()
            direct.close()
            link.close()
    unit = statistics.median(rows["SELECT 1"])
    lines = [["statement", "median ms", "p99 ms", "round trips"]]
    lines += [[name, f"{statistics.median(v):.1f}", f"{percentile(v, 99):.1f}",
               f"{statistics.median(v) / unit:.2f}"] for name, v in rows.items()]
    print(f"one-way delay {args.delay_ms:g} ms each direction; {args.claims} runs each, "
          f"one job per claim")
    print(format_table(lines))


if __name__ == "__main__":
    main()
