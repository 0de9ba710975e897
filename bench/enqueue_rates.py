"""POST /prompt through the Procfile's gunicorn at fixed offered rates: achieved rate, p50/p99/max.

Usage: .venv/bin/python -m bench.enqueue_rates [--rates 100,300,1000,max] [--seconds 5]
       [--warmup 1] [--rounds 1] [--threads 64] [--connections 32] [--generators 1]

gunicorn runs exactly as the Procfile's `web:` line (ops/gunicorn.conf.py: gevent, 2 processes)
on a scratch database. The load comes from separate generator processes (this module with
`--generate`), so no generator shares a GIL with this script or the server.

- A number is an open-loop rate: request i is scheduled at t0 + i/rate and sent by whichever of
  `--threads` threads (each with its own keep-alive httpx client) is free; latency runs from
  the SCHEDULED time, so a slow answer that delays later sends is charged to them (no
  coordinated omission). Achieved rate = answers to the measured requests / (last answer - window
  start).
- `max` is closed-loop: `--connections` keep-alive clients send back to back; latency is each
  request's own round trip, achieved rate = answers / window.

Each rate runs `--warmup` s (not measured) then `--seconds` s. With `--rounds` > 1 the rates are
interleaved (100 300 1000 max, 100 300 ...) and the table shows the median of per-round figures
(max ms: the largest of any round). Before the table, the generator is checked against
GET /healthz (no database) at the highest fixed rate: if it cannot reach that rate, the
rows at or above it measure the generator, not the server; use `--generators 2`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.common import REPO, bench_token, format_table, percentile, scratch_database, web_server

PROMPT = "/sa-core/v1/prompt"


# --- generator (child process) ---------------------------------------------------------------


def _open_loop(base: str, path: str, token: str, rate: float, start: float, warmup: float,
               seconds: float, threads: int, index: int, stride: int) -> dict[str, Any]:
    """Sends requests index, index+stride, ... at start + i/rate; latency from the schedule."""
    end = start + warmup + seconds
    window = start + warmup
    counter = itertools.count(index, stride)  # next() is atomic under the GIL
    lock = threading.Lock()
    latencies: list[float] = []
    lags: list[float] = []
    errors = 0
    last_done = window

    def run() -> None:
        nonlocal errors, last_done
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                          timeout=30.0) as client:
            while True:
                i = next(counter)
                scheduled = start + i / rate
                if scheduled >= end:
                    return
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                sent = time.perf_counter()
                try:
                    if path == PROMPT:
                        ok = client.post(path, json={"text": f"bench {i}"}).status_code == 202
                    else:
                        ok = client.get(path).status_code == 200
                except httpx.HTTPError:
                    ok = False
                done = time.perf_counter()
                if scheduled < window:
                    continue
                with lock:
                    lags.append((sent - scheduled) * 1000)
                    last_done = max(last_done, done)
                    if ok:
                        latencies.append((done - scheduled) * 1000)
                    else:
                        errors += 1

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    answered = len(latencies) + errors
    return {"latencies": latencies, "errors": errors, "answered": answered,
            "elapsed": last_done - window, "lag_p99": percentile(lags, 99) if lags else 0.0}


def _closed_loop(base: str, path: str, token: str, start: float, warmup: float, seconds: float,
                 connections: int) -> dict[str, Any]:
    """`connections` clients send back to back; counts answers completed inside the window."""
    window = start + warmup
    end = window + seconds
    lock = threading.Lock()
    latencies: list[float] = []
    errors = 0

    def run(worker: int) -> None:
        nonlocal errors
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                          timeout=30.0) as client:
            delay = start - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            for i in itertools.count():
                sent = time.perf_counter()
                if sent >= end:
                    return
                try:
                    ok = client.post(path, json={"text": f"max {worker}-{i}"}).status_code == 202
                except httpx.HTTPError:
                    ok = False
                done = time.perf_counter()
                if sent < window or done > end:
                    continue
                with lock:
                    if ok:
                        latencies.append((done - sent) * 1000)
                    else:
                        errors += 1

    pool = [threading.Thread(target=run, args=(n,)) for n in range(connections)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return {"latencies": latencies, "errors": errors, "answered": len(latencies) + errors,
            "elapsed": seconds, "lag_p99": 0.0}


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
                            args.seconds, args.threads, args.index, args.stride)
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


def run_rate(args: argparse.Namespace, base: str, token: str, rate: str,
             path: str = PROMPT) -> dict[str, Any]:
    """Runs one rate with `--generators` child processes and merges their results."""
    n = args.generators
    start_at = time.time() + 1.0  # the children need well under a second to import and connect
    procs = []
    for k in range(n):
        cmd = [sys.executable, "-m", "bench.enqueue_rates", "--generate", "--base", base,
               "--path", path, "--rate", rate, "--start-at", repr(start_at), "--warmup",
               str(args.warmup), "--seconds", str(args.seconds), "--index", str(k), "--stride",
               str(n), "--threads", str(max(1, args.threads // n)), "--connections",
               str(max(1, args.connections // n))]
        procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                                      env={**os.environ, "SA_BENCH_TOKEN": token}))
    parts = []
    for proc in procs:
        out, _ = proc.communicate(timeout=args.warmup + args.seconds + 120)
        if proc.returncode != 0:
            raise SystemExit(f"generator exited {proc.returncode}")
        parts.append(json.loads(out))
    latencies = [x for p in parts for x in p["latencies"]]
    answered = sum(p["answered"] for p in parts)
    elapsed = max(p["elapsed"] for p in parts)
    return {"latencies": latencies, "errors": sum(p["errors"] for p in parts),
            "answered": answered, "achieved": answered / elapsed if elapsed > 0 else 0.0,
            "lag_p99": max(p["lag_p99"] for p in parts)}


def table(rows: list[Row]) -> str:
    """Formats the rows in bench/peers.py's style."""
    head = ["offered/s", "achieved/s", "p50 ms", "p99 ms", "max ms", "errors", "requests"]
    lines = [head]
    for r in rows:
        med = statistics.median
        lines.append([r.rate if r.rate == "max" else f"{float(r.rate):,.0f}",
                      f"{med(r.achieved):,.0f}" if r.achieved else "-",
                      f"{med(r.p50):.1f}" if r.p50 else "-", f"{med(r.p99):.1f}" if r.p99 else "-",
                      f"{r.worst:.1f}", str(r.errors), f"{r.requests:,}"])
    return format_table(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="100,300,1000,max")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=64, help="open-loop sender threads (all generators)")
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
    with scratch_database() as url:
        token = bench_token(url)
        with web_server({"DATABASE_URL": url}, args.port):
            base = f"http://127.0.0.1:{args.port}"
            check = None
            if fixed:
                check = run_rate(args, base, token, str(max(fixed)), path="/healthz")
            for round_no in range(1, args.rounds + 1):
                for row in rows:
                    res = run_rate(args, base, token, row.rate)
                    lat = res["latencies"]
                    row.achieved.append(res["achieved"])
                    if lat:
                        row.p50.append(percentile(lat, 50))
                        row.p99.append(percentile(lat, 99))
                        row.worst = max(row.worst, max(lat))
                    row.errors += res["errors"]
                    row.requests += res["answered"]
                    print(f"round {round_no} rate {row.rate}: {res['achieved']:,.0f}/s, "
                          f"p50 {row.p50[-1] if lat else 0:.1f} ms, send lag p99 "
                          f"{res['lag_p99']:.1f} ms", file=sys.stderr, flush=True)
    print(f"POST /prompt through gunicorn per Procfile (gevent, WEB_CONCURRENCY="
          f"{os.environ.get('WEB_CONCURRENCY', '2')}); {args.generators} generator process(es), "
          f"{args.threads} open-loop threads, {args.connections} connections for max; "
          f"{args.warmup:g} s warm-up + {args.seconds:g} s per rate, {args.rounds} round(s)")
    if check is not None:
        verdict = ("reached" if check["achieved"] >= 0.95 * max(fixed)
                   else "NOT reached: that row measures the generator; raise --generators")
        print(f"generator check: GET /healthz at {max(fixed):,.0f}/s offered -> "
              f"{check['achieved']:,.0f}/s, p99 {percentile(check['latencies'], 99):.1f} ms, "
              f"send lag p99 {check['lag_p99']:.1f} ms ({verdict})")
    print()
    print(table(rows))
    print()
    print("latency from the scheduled send time (open loop; max: closed loop, per request); "
          f"p50/p99: median of {args.rounds} round(s); errors: answers other than 202 or no answer.")


if __name__ == "__main__":
    main()
