"""Sustained arrivals: a fixed POST /prompt rate for minutes against the Procfile's web and one worker.

Usage: .venv/bin/python -m bench.sustained [--rate 500] [--seconds 300] [--report-every 10]
       .venv/bin/python -m bench.sustained --rates 300,500,700,900 [--seconds 60]
       .venv/bin/python -m bench.sustained --rate 300 --latency 1 --concurrency 1024

Real processes, as the Procfile runs them: gunicorn -c python:service.gunicorn_conf (gevent, 2
processes), one `sa-core run-worker` at its default concurrency (or `--concurrency`), and `sa-core
fake-provider` answering at once (or, with `--latency`, bench/slow_provider.py answering every
call after that many seconds, as an LLM does), on a scratch database. The load comes from one
child process (this module with `--generate`) that reuses bench/enqueue_rates.py's one-thread
selector driver with prepared request bytes, so the producer costs a few tens of microseconds per
request and leaves the two cores to the server. It is open loop: request i is due at t0 + i/rate,
latency runs from that due time (a request waiting for a free connection is charged for the wait).

Every `--report-every` seconds one line: offered/s, accepted/s (202), completed/s (the worker's
own sa_job_transitions_total running -> succeeded, from its SA_METRICS_PORT), the backlog
(queued jobs, read from the database), POST p50/p99 over the interval, and the mean time of the
worker's claim statements (sa_job_claim_seconds; "-" for a worker without that metric).

With several `--rates` the same processes step through them, `--seconds` each, after the
backlog of the previous step has drained (up to 60 s). A rate "keeps up" when the backlog at
the end of its step is under two seconds of arrivals and POST p99 is under 50 ms.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from bench.common import (
    REPO,
    VENV_BIN,
    bench_token,
    format_table,
    percentile,
    scratch_database,
    spawn,
    start_slow_provider,
    wait_http,
    web_server,
)
from bench.enqueue_rates import PROMPT, Connections, request_maker

BACKLOG = "SELECT count(*) FROM sa_job WHERE state = 'queued'"
KEEPS_UP_BACKLOG_SECONDS = 2.0
KEEPS_UP_P99_MS = 50.0


# --- generator (child process) ---------------------------------------------------------------


def generate(args: argparse.Namespace) -> None:
    """Child entry point: offers `--rate` POSTs/s for `--seconds`; prints one JSON line per interval."""
    token = os.environ["SA_BENCH_TOKEN"]
    rate, every = float(args.rate), args.report_every
    address, make = request_maker(args.base, PROMPT, token)
    pool = Connections(address, args.open_connections)
    pending: collections.deque[tuple[int, float]] = collections.deque()
    start = time.perf_counter()
    end = start + args.seconds
    next_report = start + every
    latencies: list[float] = []
    offered = errors = 0
    i = 0
    while True:
        now = time.perf_counter()
        while (due := start + i / rate) <= now and due < end:
            pending.append((i, due))
            offered += 1
            i += 1
        while pending and pool.idle:
            n, due_at = pending.popleft()
            conn = pool.idle.popleft()
            conn.scheduled = due_at
            pool.send(conn, make(n))
        if now >= next_report or (due >= end and not pending and not pool.busy):
            print(json.dumps({"offered": offered, "accepted": len(latencies), "errors": errors,
                              "p50": percentile(latencies, 50) if latencies else None,
                              "p99": percentile(latencies, 99) if latencies else None,
                              "waiting": len(pending)}), flush=True)
            latencies, offered, errors = [], 0, 0
            next_report += every
            if due >= end and not pending and not pool.busy:
                return
        timeout = min(max(due - time.perf_counter(), 0.0), next_report - now, 1.0)
        for conn, status in pool.poll(max(timeout, 0.0)):
            pool.idle.append(conn)
            if status == 202:
                latencies.append((time.perf_counter() - conn.scheduled) * 1000)
            else:
                errors += 1


# --- driver ----------------------------------------------------------------------------------


class WorkerScrape:
    """The worker's completed-job counter and claim-time histogram, read from its metrics port."""

    def __init__(self, url: str) -> None:
        self.url = url

    def read(self) -> dict[str, float]:
        """Returns {"completed", "claim_sum", "claim_count"} (claim_* absent without the metric)."""
        text = httpx.get(self.url, timeout=5.0).text
        out: dict[str, float] = {"completed": 0.0}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if (sample.name == "sa_job_transitions_total"
                        and sample.labels.get("to_state") == "succeeded"):
                    out["completed"] += sample.value
                elif sample.name == "sa_job_claim_seconds_sum":
                    out["claim_sum"] = sample.value
                elif sample.name == "sa_job_claim_seconds_count":
                    out["claim_count"] = sample.value
        return out


@dataclass
class Step:
    """One offered rate's figures over its whole step."""

    rate: float
    accepted: int = 0
    offered: int = 0
    errors: int = 0
    completed: float = 0.0
    elapsed: float = 0.0
    backlog_end: int = 0
    backlog_max: int = 0
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    claim_ms: list[float] = field(default_factory=list)

    @property
    def keeps_up(self) -> bool:
        """Backlog bounded (under two seconds of arrivals at the end) and POST p99 under 50 ms."""
        return (self.backlog_end < KEEPS_UP_BACKLOG_SECONDS * self.rate
                and bool(self.p99) and max(self.p99) < KEEPS_UP_P99_MS and self.errors == 0)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def run_step(args: argparse.Namespace, base: str, token: str, rate: float,
             db: psycopg.Connection[Any], worker: WorkerScrape) -> Step:
    """Offers `rate` for `--seconds`, printing a line per interval; returns the step's figures."""
    step = Step(rate)
    cmd = [sys.executable, "-m", "bench.sustained", "--generate", "--base", base, "--rate",
           str(rate), "--seconds", str(args.seconds), "--report-every", str(args.report_every),
           "--open-connections", str(args.open_connections)]
    child = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "SA_BENCH_TOKEN": token})
    assert child.stdout is not None
    last, last_t, t0 = worker.read(), time.monotonic(), time.monotonic()
    print(f"\n-- offered {rate:,.0f} POST/s for {args.seconds:g} s")
    print(f"{'t s':>6} {'offered/s':>9} {'accepted/s':>10} {'completed/s':>11} {'backlog':>8} "
          f"{'POST p50':>8} {'POST p99':>8} {'claim ms':>8}", flush=True)
    for line in child.stdout:
        part = json.loads(line)
        now, seen = time.monotonic(), worker.read()
        span = now - last_t
        completed = seen["completed"] - last["completed"]
        claims = seen.get("claim_count", 0.0) - last.get("claim_count", 0.0)
        claim_ms = ((seen["claim_sum"] - last["claim_sum"]) * 1000 / claims
                    if claims > 0 else None)
        backlog = int(db.execute(BACKLOG).fetchone()[0])  # type: ignore[index]
        print(f"{now - t0:6.0f} {part['offered'] / span:9.0f} {part['accepted'] / span:10.0f} "
              f"{completed / span:11.0f} {backlog:8d} {_ms(part['p50']):>8} {_ms(part['p99']):>8} "
              f"{_ms(claim_ms):>8}", flush=True)
        step.offered += part["offered"]
        step.accepted += part["accepted"]
        step.errors += part["errors"]
        step.completed += completed
        step.backlog_end, step.backlog_max = backlog, max(step.backlog_max, backlog)
        if part["p50"] is not None:
            step.p50.append(part["p50"])
            step.p99.append(part["p99"])
        if claim_ms is not None:
            step.claim_ms.append(claim_ms)
        last, last_t = seen, now
    step.elapsed = time.monotonic() - t0
    child.wait()
    return step


def _drain(db: psycopg.Connection[Any], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and db.execute(BACKLOG).fetchone()[0]:  # type: ignore[index]
        time.sleep(0.5)


def summary(steps: list[Step]) -> str:
    """One row per offered rate."""
    lines = [["offered/s", "accepted/s", "completed/s", "backlog end", "backlog max",
              "POST p50 ms", "POST p99 ms (worst 10 s)", "claim ms (mean)", "errors", "keeps up"]]
    for s in steps:
        lines.append([f"{s.rate:,.0f}", f"{s.accepted / s.elapsed:,.0f}",
                      f"{s.completed / s.elapsed:,.0f}", f"{s.backlog_end:,}", f"{s.backlog_max:,}",
                      f"{sorted(s.p50)[len(s.p50) // 2]:.1f}" if s.p50 else "-",
                      f"{max(s.p99):.1f}" if s.p99 else "-",
                      f"{sum(s.claim_ms) / len(s.claim_ms):.2f}" if s.claim_ms else "-",
                      str(s.errors), "yes" if s.keeps_up else "NO"])
    return format_table(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--rates", help="step through these rates (comma-separated) instead")
    parser.add_argument("--seconds", type=float, default=300.0, help="per rate")
    parser.add_argument("--report-every", type=float, default=10.0)
    parser.add_argument("--open-connections", type=int, default=64)
    parser.add_argument("--port", type=int, default=8771)
    parser.add_argument("--provider-port", type=int, default=8772)
    parser.add_argument("--metrics-port", type=int, default=8773)
    parser.add_argument("--latency", type=float, default=0.0,
                        help="seconds the provider takes per call (0: the fake provider, at once)")
    parser.add_argument("--concurrency", type=int, help="the worker's (default: its own default)")
    # generator child only
    parser.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--base", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        generate(args)
        return
    rates = [float(r) for r in args.rates.split(",")] if args.rates else [args.rate]
    with scratch_database() as url, psycopg.connect(url, autocommit=True) as db:
        token = bench_token(url)
        provider: subprocess.Popen[Any]
        if args.latency > 0:
            provider, provider_url = start_slow_provider(args.latency)
        else:
            provider_url = f"http://127.0.0.1:{args.provider_port}"
            provider = spawn([str(VENV_BIN / "sa-core"), "fake-provider", "--port",
                              str(args.provider_port)], {})
            wait_http(f"{provider_url}/healthz")
        env = {"DATABASE_URL": url, "SA_PROVIDER_URL": provider_url}
        concurrency = [] if args.concurrency is None else ["--concurrency", str(args.concurrency)]
        worker = spawn([str(VENV_BIN / "sa-core"), "run-worker", *concurrency],
                       {**env, "SA_METRICS_PORT": str(args.metrics_port)})
        try:
            wait_http(f"http://127.0.0.1:{args.metrics_port}/metrics")
            with web_server(env, args.port):
                print(f"Procfile web (gunicorn gevent, WEB_CONCURRENCY="
                      f"{os.environ.get('WEB_CONCURRENCY', '2')}), one `sa-core run-worker` "
                      f"(concurrency {args.concurrency or 'default'}), provider answering after "
                      f"{args.latency:g} s; {args.open_connections} producer connections")
                scrape = WorkerScrape(f"http://127.0.0.1:{args.metrics_port}/metrics")
                steps = []
                for rate in rates:
                    _drain(db)
                    steps.append(run_step(args, f"http://127.0.0.1:{args.port}", token, rate, db,
                                          scrape))
        finally:
            for proc in (worker, provider):
                proc.terminate()
            for proc in (worker, provider):
                proc.wait(timeout=60)
    print()
    print(summary(steps))
    print(f"\nkeeps up: backlog at the end under {KEEPS_UP_BACKLOG_SECONDS:g} s of arrivals, every "
          f"interval's POST p99 under {KEEPS_UP_P99_MS:g} ms, no error. POST latency from the "
          "scheduled send (open loop).")


if __name__ == "__main__":
    main()
