"""Sustained arrivals: a fixed POST /prompt rate for minutes against the Procfile's web and one worker.

Usage: .venv/bin/python -m bench.sustained [--rate 500] [--seconds 300] [--report-every 10]
       .venv/bin/python -m bench.sustained --rates 300,500,700,900 [--seconds 60]
       .venv/bin/python -m bench.sustained --rate 300 --latency 1 --concurrency 1024

Real processes, as the Procfile runs them: gunicorn -c python:service.gunicorn_conf (gevent, 2
processes), one `sa-core run-worker` at its default concurrency (or `--concurrency`), and
bench/slow_provider.py answering every call at once (or, with `--latency`, after that many
seconds, as an LLM does), on a scratch database. A real provider runs on other machines, so the
stand-in is the cheapest one at hand (raw asyncio): `sa-core fake-provider`, a thread per
connection, took 24 % of a core at about 850 calls/s, three times as much. The load comes from one
child process (this module with `--generate`) that reuses bench/enqueue_rates.py's one-thread
selector driver with prepared request bytes, so the producer costs a few tens of microseconds per
request and leaves the two cores to the server. It is open loop and light: request i is due at
t0 + i/rate and goes out at once on a free one of `--open-connections` keep-alive connections;
when all are busy it is shed (never sent, counted), as a client with a bounded pool would give
up on it. Latency runs from the due time.

Every `--report-every` seconds one line: offered/s, accepted/s (202), shed (the requests not sent
for want of a free connection, per second and as a share of those offered), errors (answers
other than 202, and requests whose connection the server closed or refused), completed/s (the
worker's own sa_job_transitions_total running -> succeeded, from its SA_METRICS_PORT), the
backlog (queued jobs, read from the database), POST p50/p99 over the interval, the mean time of
the worker's claim statements (sa_job_claim_seconds; "-" for a worker without that metric), and
the CPU used by the web processes (gunicorn master and workers) and by the bench database's
Postgres backends, in % of one core ("-" when the server is remote).

With several `--rates` the same processes step through them, `--seconds` each, after the
backlog of the previous step has drained (up to 60 s). A rate "keeps up" when under 1 % of its
requests were shed, none failed, the backlog at the end of its step is under two seconds of
arrivals and every interval's POST p99 is under 50 ms. The summary adds the worker's claim
statements per completed job.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
from bench.enqueue_rates import PROMPT, Connections, ServerCpu, _proc_cpu, request_maker

BACKLOG = "SELECT count(*) FROM sa_job WHERE state = 'queued'"
KEEPS_UP_BACKLOG_SECONDS = 2.0
KEEPS_UP_P99_MS = 50.0
KEEPS_UP_SHED = 0.01


# --- generator (child process) ---------------------------------------------------------------


def generate(args: argparse.Namespace) -> None:
    """Child entry point: offers `--rate` POSTs/s for `--seconds`; prints one JSON line per interval.

    A light producer: a request due while all `--open-connections` are busy is shed (never
    sent, counted), as a client with a bounded connection pool gives up on it; queueing it
    instead would let one slow second delay every later request and hide how many were lost.
    """
    token = os.environ["SA_BENCH_TOKEN"]
    rate, every = float(args.rate), args.report_every
    address, make = request_maker(args.base, PROMPT, token)
    pool = Connections(address, args.open_connections)
    start = time.perf_counter()
    end = start + args.seconds
    next_report = start + every
    latencies: list[float] = []
    offered = errors = shed = 0
    i = 0
    while True:
        now = time.perf_counter()
        while (due := start + i / rate) <= now and due < end:
            offered += 1
            if pool.idle:
                conn = pool.idle.popleft()
                conn.scheduled = due
                pool.send(conn, make(i))
            else:
                shed += 1
            i += 1
        finished = due >= end and not pool.busy
        if now >= next_report or finished:
            print(json.dumps({"offered": offered, "accepted": len(latencies), "errors": errors,
                              "shed": shed,
                              "p50": percentile(latencies, 50) if latencies else None,
                              "p99": percentile(latencies, 99) if latencies else None}),
                  flush=True)
            latencies, offered, errors, shed = [], 0, 0, 0
            next_report += every
            if finished:
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
    shed: int = 0
    completed: float = 0.0
    elapsed: float = 0.0
    backlog_end: int = 0
    backlog_max: int = 0
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    claim_ms: list[float] = field(default_factory=list)
    claims: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)

    def add(self, part: dict[str, Any], completed: float, backlog: int, claims: float,
            claim_ms: float | None, used: dict[str, float]) -> None:
        """Adds one interval: the producer's counts, the worker's, the backlog and the CPU."""
        self.offered += part["offered"]
        self.accepted += part["accepted"]
        self.errors += part["errors"]
        self.shed += part["shed"]
        self.completed += completed
        self.claims += claims
        self.backlog_end, self.backlog_max = backlog, max(self.backlog_max, backlog)
        if part["p50"] is not None and part["offered"]:
            self.p50.append(part["p50"])
            self.p99.append(part["p99"])
        if claim_ms is not None:
            self.claim_ms.append(claim_ms)
        for name, seconds in used.items():
            self.cpu[name] = self.cpu.get(name, 0.0) + seconds

    @property
    def shed_share(self) -> float:
        """The share of offered requests shed for want of a free connection."""
        return self.shed / self.offered if self.offered else 0.0

    @property
    def keeps_up(self) -> bool:
        """Under 1 % shed, no error, backlog bounded (under two seconds of arrivals at the end)
        and every interval's POST p99 under 50 ms."""
        return (self.backlog_end < KEEPS_UP_BACKLOG_SECONDS * self.rate
                and bool(self.p99) and max(self.p99) < KEEPS_UP_P99_MS and self.errors == 0
                and self.shed_share < KEEPS_UP_SHED)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


class StepCpu:
    """CPU seconds of the web processes, the worker and the bench database's backends between
    two samples (bench/enqueue_rates.py's ServerCpu, plus the worker)."""

    def __init__(self, server: ServerCpu, worker_pid: int) -> None:
        self._server = server
        self._worker = worker_pid
        self._worker_start = 0.0

    def start(self) -> None:
        """Takes the first sample."""
        self._server.start()
        self._worker_start = _proc_cpu([self._worker]).get(self._worker, 0.0)

    def lap(self) -> dict[str, float]:
        """Returns {"web", "worker", "pg"} seconds since the last sample and starts the next."""
        used = self._server.stop()
        worker = _proc_cpu([self._worker]).get(self._worker)
        if worker is not None:
            used["worker"] = worker - self._worker_start
        self.start()
        return used


CPU_KINDS = ("web", "worker", "pg")


def _pct(used: dict[str, float], name: str, span: float) -> str:
    return f"{used[name] * 100 / span:.0f}" if name in used and span > 0 else "-"


def run_step(args: argparse.Namespace, base: str, token: str, rate: float,
             db: psycopg.Connection[Any], worker: WorkerScrape, cpu: StepCpu) -> Step:
    """Offers `rate` for `--seconds`, printing a line per interval; returns the step's figures."""
    step = Step(rate)
    cmd = [sys.executable, "-m", "bench.sustained", "--generate", "--base", base, "--rate",
           str(rate), "--seconds", str(args.seconds), "--report-every", str(args.report_every),
           "--open-connections", str(args.open_connections)]
    child = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "SA_BENCH_TOKEN": token})
    assert child.stdout is not None
    last, last_t, t0 = worker.read(), time.monotonic(), time.monotonic()
    cpu.start()
    print(f"\n-- offered {rate:,.0f} POST/s for {args.seconds:g} s")
    print(f"{'t s':>6} {'offered/s':>9} {'accepted/s':>10} {'shed/s':>7} {'shed %':>6} "
          f"{'errors':>6} {'completed/s':>11} {'backlog':>8} {'POST p50':>8} {'POST p99':>8} "
          f"{'claim ms':>8} " + " ".join(f"{kind + ' cpu%':>11}" for kind in CPU_KINDS),
          flush=True)
    for line in child.stdout:
        part = json.loads(line)
        now, seen, used = time.monotonic(), worker.read(), cpu.lap()
        span = now - last_t
        completed = seen["completed"] - last["completed"]
        claims = seen.get("claim_count", 0.0) - last.get("claim_count", 0.0)
        claim_ms = ((seen["claim_sum"] - last["claim_sum"]) * 1000 / claims
                    if claims > 0 else None)
        backlog = int(db.execute(BACKLOG).fetchone()[0])  # type: ignore[index]
        step.add(part, completed, backlog, claims, claim_ms, used)
        last, last_t = seen, now
        if not part["offered"]:
            continue  # NOTE: the tail after the last send: too short an interval to show
        shed_pct = part["shed"] * 100 / part["offered"]
        print(f"{now - t0:6.0f} {part['offered'] / span:9.0f} {part['accepted'] / span:10.0f} "
              f"{part['shed'] / span:7.0f} {shed_pct:6.2f} {part['errors']:6d} "
              f"{completed / span:11.0f} {backlog:8d} {_ms(part['p50']):>8} {_ms(part['p99']):>8} "
              f"{_ms(claim_ms):>8} " + " ".join(f"{_pct(used, kind, span):>11}"
                                                for kind in CPU_KINDS), flush=True)
    step.elapsed = time.monotonic() - t0
    child.wait()
    return step


def _drain(db: psycopg.Connection[Any], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and db.execute(BACKLOG).fetchone()[0]:  # type: ignore[index]
        time.sleep(0.5)


def summary(steps: list[Step]) -> str:
    """One row per offered rate."""
    lines = [["offered/s", "accepted/s", "shed", "shed %", "completed/s", "backlog end",
              "backlog max", "POST p50 ms", "POST p99 ms (median / worst interval)",
              "claim ms (mean)", "claims a job", *(f"{kind} cpu%" for kind in CPU_KINDS), "errors",
              "keeps up"]]
    for s in steps:
        lines.append([f"{s.rate:,.0f}", f"{s.accepted / s.elapsed:,.0f}", f"{s.shed:,}",
                      f"{s.shed_share * 100:.2f}",
                      f"{s.completed / s.elapsed:,.0f}", f"{s.backlog_end:,}", f"{s.backlog_max:,}",
                      f"{statistics.median(s.p50):.1f}" if s.p50 else "-",
                      f"{statistics.median(s.p99):.1f} / {max(s.p99):.1f}" if s.p99 else "-",
                      f"{sum(s.claim_ms) / len(s.claim_ms):.2f}" if s.claim_ms else "-",
                      f"{s.claims / s.completed:.2f}" if s.claims and s.completed else "-",
                      *(_pct(s.cpu, kind, s.elapsed) for kind in CPU_KINDS),
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
    parser.add_argument("--metrics-port", type=int, default=8773)
    parser.add_argument("--latency", type=float, default=0.0,
                        help="seconds the provider takes per call (0: at once)")
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
        provider, provider_url = start_slow_provider(args.latency)
        env = {"DATABASE_URL": url, "SA_PROVIDER_URL": provider_url}
        concurrency = [] if args.concurrency is None else ["--concurrency", str(args.concurrency)]
        worker = spawn([str(VENV_BIN / "sa-core"), "run-worker", *concurrency],
                       {**env, "SA_METRICS_PORT": str(args.metrics_port)})
        try:
            wait_http(f"http://127.0.0.1:{args.metrics_port}/metrics")
            with web_server(env, args.port) as web:
                print(f"Procfile web (gunicorn gevent, WEB_CONCURRENCY="
                      f"{os.environ.get('WEB_CONCURRENCY', '2')}), one `sa-core run-worker` "
                      f"(concurrency {args.concurrency or 'default'}), provider answering after "
                      f"{args.latency:g} s; {args.open_connections} producer connections")
                scrape = WorkerScrape(f"http://127.0.0.1:{args.metrics_port}/metrics")
                cpu = StepCpu(ServerCpu(web.pid, db), worker.pid)
                steps = []
                for rate in rates:
                    _drain(db)
                    steps.append(run_step(args, f"http://127.0.0.1:{args.port}", token, rate, db,
                                          scrape, cpu))
        finally:
            for proc in (worker, provider):
                proc.terminate()
            for proc in (worker, provider):
                proc.wait(timeout=60)
    print()
    print(summary(steps))
    print(f"\nkeeps up: under {KEEPS_UP_SHED * 100:g} % shed, no error, backlog at the end under "
          f"{KEEPS_UP_BACKLOG_SECONDS:g} s of arrivals, every interval's POST p99 under "
          f"{KEEPS_UP_P99_MS:g} ms. shed: requests not sent for want of a free connection (of "
          f"{args.open_connections}); errors: answers other than 202, or connections closed or "
          "refused. POST latency from the scheduled send (open loop). cpu%: of one core, over "
          "the step.")


if __name__ == "__main__":
    main()
