"""sa-core's own runner for bench/peers.py: the same burn-down and pick-up on the real queue.

Usage: .venv/bin/python -m bench.peer_runners.sa_core DATABASE_URL
       (burndown N | llm N | pickup K | post S) [--concurrency C] [--variant full|noop]
       [--procs P] [--provider-url URL] [--stream]

The database must already carry sa-core's migrations. Every job is a real prompt entity plus
a queued job written by `jobqueue.engine.enqueue.enqueue`, one call (one commit) each.

- full: real `sa-core run-worker --concurrency C` against bench/slow_provider.py answering at
  once; each job makes an HTTP call and its finalize writes the response entity, the flows-to
  edge, the ledger and audit rows and the events. The worker is the shipped command, so
  pick-up uses whatever wake-up it ships with. Task start is not observable from outside the
  worker, so it is taken as the job's `running` event (`sa_job_event.at`, clock_timestamp()
  inside the claim statement): a little earlier than the task's real start.
- threads: as full, but `run-worker` without gevent's monkey-patching (one OS thread per job
  slot, the model before gevent), for bench/llm_shaped.py's comparison.
- llm (full and threads): the burn-down against `--provider-url` instead of the instant one; also
  reports the worker process's CPU seconds and peak RSS (from /proc) at the end. With `--stream`
  that provider is one route with `"stream": true` (SA_PROVIDER_ROUTES), so every job asks for
  a streamed answer and writes its text as it arrives (bench/llm_shaped.py --stream).
- noop: the same Worker, Executor and finalize in this process, with a provider stub that
  answers at once without HTTP (still a full finalize: response, edge, ledger, events), and a
  NotificationListener wired to `Worker.on_job_queued` the way tests/helpers.py's WorkerHarness does.
  Task start is the stub's call, as the libraries' runners take it. Both variants also
  report `claim_ms` (enqueue commit -> `running` event).

- `--procs P` (full): P `sa-core run-worker` processes share the burn-down (the Procfile's
  `worker:` line scaled to P), each at `--concurrency C`.
- post: `POST /prompt` through the Procfile's gunicorn on this database for S seconds after a 1 s
  warm-up, closed loop on 32 keep-alive connections from one generator process
  (bench/enqueue_rates.py's `max`); reports answers per second as `enqueue_per_s`.

The end of a burn-down is the last `succeeded` event's `at` (clock_timestamp() in the finalize,
just before its commit), read once every job succeeded: the database's view, as the other
runners take it, and no reader busy on the machine while the worker runs.
Prints one `PEER_RESULT {json}` line like the other runners.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from importlib.metadata import version
from typing import Any

import psycopg

from bench.common import VENV_BIN, bench_token, percentile, spawn, start_slow_provider, web_server
from bench.enqueue_rates import ServerCpu, run_rate
from bench.peer_runners._runner import WARMUP_JOBS, build_parser, emit
from jobqueue.core.db import open_pool
from jobqueue.core.logs import configure_logging
from jobqueue.core.routes import Route, Routes
from jobqueue.core.settings import Settings
from jobqueue.core.tokens import Caller
from jobqueue.engine.enqueue import enqueue
from jobqueue.runtime.assembly import assemble_worker
from jobqueue.runtime.provider import Provider, RoutedProviders
from jobqueue.runtime.provider_answer import Completion
from jobqueue.runtime.run_control import RunControl
from jobqueue.runtime.worker_config import WorkerConfig

CALLER = Caller(org_id=1, user_id=1)
EVENT_TIMEOUT = 60.0
RUNNING_AT = """
SELECT extract(epoch FROM at)::float8 AS at
  FROM sa_job_event WHERE job_id = %s AND to_state = 'running' ORDER BY id LIMIT 1
"""
FIRST_RUNNING_AT = """
SELECT extract(epoch FROM min(at))::float8 AS at FROM sa_job_event WHERE to_state = 'running'
"""
COUNTS = "SELECT state, count(*) AS n FROM sa_job GROUP BY state"
JOB_STATE = "SELECT state FROM sa_job WHERE id = %s"
STATE_COUNT = "SELECT count(*) FROM sa_job WHERE state = %s"
LAST_SUCCEEDED_AT = ("SELECT extract(epoch FROM max(at))::float8 FROM sa_job_event "
                     "WHERE to_state = 'succeeded'")


THREADED_CLI = "import sys; from jobqueue.operator.cli import main; sys.exit(main(sys.argv[2:]))"


class StubProvider(Provider):
    """Answers every call at once, without HTTP; records when each prompt's call started."""

    def __init__(self) -> None:
        self.first_call: float | None = None
        self.calls: dict[str, float] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        pass

    def complete(self, model: str, messages: list[dict[str, str]],
                 on_delta: Callable[[str], None] | None = None,
                 params: Mapping[str, Any] | None = None,
                 control: RunControl | None = None) -> Completion:
        now = time.time()
        with self._lock:
            if self.first_call is None:
                self.first_call = now
            self.calls[messages[-1]["content"]] = now
        return Completion(content="ok", model=model, tokens_in=None, tokens_out=None,
                          http_status=200, latency_ms=0, request_id=None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Events:
    """A LISTEN on sa_job_event (empty payloads, sent at commit) to follow one job at a time."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("LISTEN sa_job_event")

    def wait(self, job_id: str, to_state: str, alive: Callable[[], None]) -> float:
        """Blocks until `job_id` is in `to_state`; returns when the notification of that commit
        arrived (time.time())."""
        deadline = time.monotonic() + EVENT_TIMEOUT
        while time.monotonic() < deadline:
            received = None
            # NOTE: the notifies() generator holds the connection's lock while suspended, so
            # the job is read only once it has finished.
            for _ in self.conn.notifies(timeout=0.5, stop_after=1):
                received = time.time()
            if received is not None:
                row = self.conn.execute(JOB_STATE, (job_id,)).fetchone()
                if row is not None and row[0] == to_state:
                    return received
            alive()
        raise TimeoutError(f"job {job_id} did not reach {to_state} in time")

    def close(self) -> None:
        self.conn.close()


def last_success(url: str, n: int, alive: Callable[[], None], timeout: float) -> float:
    """Waits (polling every 0.1 s) until `n` jobs succeeded; returns when the last one did,
    as the database stamped it (its `succeeded` event's `at`), like the other runners. A failed
    job ends the run at once (a broken runner would otherwise wait out the whole timeout)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            failed = conn.execute(STATE_COUNT, ("failed",)).fetchone()
            if failed is not None and failed[0]:
                raise RuntimeError(f"{failed[0]} job(s) failed; see the worker's log")
            row = conn.execute(STATE_COUNT, ("succeeded",)).fetchone()
            if row is not None and row[0] >= n:
                last = conn.execute(LAST_SUCCEEDED_AT).fetchone()
                assert last is not None
                return float(last[0])
            alive()
            time.sleep(0.1)
    raise TimeoutError(f"not all {n} jobs succeeded in time")


class Runner:
    """One variant's worker and provider, started and stopped around a measurement."""

    def __init__(self, url: str, variant: str, concurrency: int, provider_url: str | None = None,
                 stream: bool = False, procs: int = 1) -> None:
        self.url = url
        self.workers = procs
        self.stream = stream
        self.variant = variant
        self.concurrency = concurrency
        self.provider_url = provider_url
        self.stub = StubProvider()
        self.procs: list[Any] = []
        self.stops: list[Callable[[], None]] = []

    @contextmanager
    def worker(self) -> Iterator[None]:
        try:
            if self.variant in ("full", "threads"):
                self._start_processes()
            else:
                self._start_in_process()
            yield
        finally:
            for stop in reversed(self.stops):
                stop()
            self.stops.clear()

    def alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[:2]} exited with {proc.returncode}")

    def worker_usage(self) -> dict[str, float]:
        """The worker processes' CPU seconds so far and the largest peak RSS (full variant)."""
        cpu, rss = 0.0, 0.0
        for proc in self.procs[-self.workers:]:
            with open(f"/proc/{proc.pid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
            with open(f"/proc/{proc.pid}/status") as status:
                hwm = next(line for line in status if line.startswith("VmHWM:"))
            cpu += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            rss = max(rss, int(hwm.split()[1]) / 1024)
        return {"worker_cpu_s": cpu, "peak_rss_mib": rss}

    def _start_processes(self) -> None:
        provider_url = self.provider_url
        if provider_url is None:
            provider, provider_url = start_slow_provider(0.0)
            self.procs.append(provider)
            self.stops.append(lambda: _end(provider))
        env = {"DATABASE_URL": self.url, "SA_PROVIDER_URL": provider_url}
        if self.stream:
            env = {"DATABASE_URL": self.url, "SA_PROVIDER_URL": "", "SA_PROVIDER_ROUTES": json.dumps(
                {"routes": [{"name": "streamed", "base_url": provider_url, "stream": True}]})}
        command = [str(VENV_BIN / "sa-core")]
        if self.variant == "threads":
            # NOTE: argv[1] is not `run-worker`, so jobqueue/runtime/green.py leaves threads as they are.
            command = [sys.executable, "-c", THREADED_CLI, "--"]
        for _ in range(self.workers):
            worker = spawn([*command, "run-worker", "--concurrency", str(self.concurrency)], env)
            self.procs.append(worker)
            self.stops.append(partial(_end, worker))

    def _start_in_process(self) -> None:
        routes = Routes((Route("default", "http://stub.invalid"),), "noop")
        settings = Settings(database_url=self.url, direct_database_url=self.url,
                            provider_url="http://stub.invalid", provider_api_key="",
                            provider_model="noop", statement_timeout=0, lock_timeout=0)
        parts = assemble_worker(settings, WorkerConfig(concurrency=self.concurrency),
                                providers=RoutedProviders(routes, {"default": self.stub}))
        self.stops.append(parts.close)
        worker = parts.worker
        if not parts.listen(self.url).listening.wait(10):
            raise RuntimeError("listener did not start")
        thread = threading.Thread(target=worker.run, name="bench-worker", daemon=True)
        thread.start()

        def stop() -> None:
            worker.stop()
            thread.join(timeout=30)

        self.stops.append(stop)


def _end(proc: Any) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except Exception:
        proc.kill()


def _counts(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return {state: n for state, n in conn.execute(COUNTS).fetchall()}


def burndown(url: str, runner: Runner, jobs: int, timeout: float) -> dict[str, Any]:
    pool = open_pool(url, name="bench-enqueue", max_size=1)
    try:
        started = time.perf_counter()
        for seq in range(jobs):
            enqueue(pool, CALLER, f"bench {seq}")
        enqueue_s = time.perf_counter() - started
    finally:
        pool.close()
    usage: dict[str, float] = {}
    with runner.worker():
        finished = last_success(url, jobs, runner.alive, timeout)
        if runner.variant != "noop":
            usage = runner.worker_usage()
    if runner.variant != "noop":
        with psycopg.connect(url) as conn:
            row = conn.execute(FIRST_RUNNING_AT).fetchone()
        assert row is not None
        first = float(row[0])
    else:
        assert runner.stub.first_call is not None
        first = runner.stub.first_call
    counts = _counts(url)
    if counts.get("succeeded", 0) != jobs:
        raise RuntimeError(f"not every job succeeded: {counts}")
    burndown_s = finished - first
    return {"jobs": jobs, "enqueue_s": enqueue_s, "enqueue_per_s": jobs / enqueue_s,
            "burndown_s": burndown_s, "jobs_per_s": jobs / burndown_s, **usage}


def pickup(url: str, runner: Runner, pickups: int, budget: float) -> dict[str, Any]:
    pool = open_pool(url, name="bench-enqueue", max_size=1)
    events = Events(url)
    latencies: list[float] = []
    claims: list[float] = []
    deadline = time.monotonic() + budget
    try:
        with runner.worker():
            for seq in range(-WARMUP_JOBS, pickups):
                if seq >= 0 and time.monotonic() > deadline:
                    break
                text = f"pickup {seq} {uuid.uuid4().hex[:6]}"
                job_id = str(enqueue(pool, CALLER, text).job_id)
                committed = time.time()
                events.wait(job_id, "succeeded", runner.alive)
                with pool.connection() as conn:
                    row = conn.execute(RUNNING_AT, (job_id,)).fetchone()
                assert row is not None
                claimed = float(row["at"])
                started = claimed if runner.variant != "noop" else runner.stub.calls[text]
                if seq >= 0:
                    latencies.append((started - committed) * 1000)
                    claims.append((claimed - committed) * 1000)
                time.sleep(random.uniform(0.02, 0.06))
    finally:
        events.close()
        pool.close()
    return {"pickups": pickups, "pickup_ms": latencies, "claim_ms": claims}


def post(url: str, seconds: float) -> dict[str, Any]:
    """POST /prompt/s through the Procfile's web on this database (bench/enqueue_rates.py's `max`)."""
    args = argparse.Namespace(generators=1, warmup=1.0, seconds=seconds, open_connections=64,
                              connections=32)
    port = _free_port()
    with (psycopg.connect(url, autocommit=True) as conn,
          web_server({"DATABASE_URL": url}, port) as web):
        token = bench_token(url)
        result = run_rate(args, f"http://127.0.0.1:{port}", token, "max", ServerCpu(web.pid, conn))
    if result["errors"]:
        raise RuntimeError(f"{result['errors']} POST(s) answered other than 202")
    latencies = result["latencies"]
    return {"seconds": seconds, "enqueue_per_s": result["achieved"],
            "post_p99_ms": percentile(latencies, 99) if latencies else None,
            "cpu_us": result["cpu_us"]}


def main() -> None:
    parser = build_parser()
    parser.add_argument("--variant", choices=["full", "threads", "noop"], default="full")
    parser.add_argument("--procs", type=int, default=1,
                        help="full: worker processes sharing the burn-down")
    parser.add_argument("--stream", action="store_true",
                        help="llm: the provider's route streams (each job writes its text as it comes)")
    args = parser.parse_args()
    configure_logging()
    # NOTE: the in-process worker logs JSON lines like `sa-core run-worker` does; they go where
    # the real worker's go in the full variant (nowhere), and the result line to the real stdout.
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    runner = Runner(args.database_url, args.variant, args.concurrency, args.provider_url,
                    args.stream, args.procs)
    if args.mode == "post":
        result = post(args.database_url, args.count)
    elif args.mode in ("burndown", "llm"):
        result = burndown(args.database_url, runner, args.count, args.timeout)
    else:
        result = pickup(args.database_url, runner, args.count, args.budget)
    emit({"ok": True, "library": {"full": "sa-core", "threads": "sa-core/threads"}.get(
              args.variant, "sa-core/no-op"),
          "version": version("sa-core"), "python": sys.version.split()[0], "mode": args.mode,
          "concurrency": args.concurrency, "variant": args.variant, "stream": args.stream,
          **result})


if __name__ == "__main__":
    main()
