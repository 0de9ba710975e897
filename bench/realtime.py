"""Realtime latency through the Procfile's processes: (a) enqueue -> running, (b) SSE delivery.

(a) One idle worker (LISTEN wake-up, default 2 s poll as fallback): a prompt is POSTed, the
    next one only once the previous job succeeded, so the worker is idle each time. Measured
    from the enqueue's commit (when this script's own LISTEN connection hears the job's
    `sa_job_queued` notification, which Postgres sends at commit; prompts go one at a time, so
    the n-th notification is the n-th prompt's) to the `at` of its `running` event,
    and also from the `at` of the `queued` event, which is stamped before the enqueue commits
    and so includes that commit's WAL flush. Targets: p50 <= 2 ms, p99 <= 5 ms.
(b) 1, 100 and 500 SSE clients of one user on ONE gunicorn (gevent) web process, while prompts
    are POSTed at a steady pace and the worker runs them: every event reaches every client.
    Latency is the client's receipt time minus the event's `at` (same host, same clock).
    Target: p99 under 200 ms at 500 clients, aiming for 50 ms. POST /prompt latency is measured
    at the same time.

Usage: .venv/bin/python -m bench.realtime [--jobs 200] [--prompts 100] [--clients 1,100,500]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

import httpx
import psycopg

from bench.common import VENV_BIN, bench_token, percentile, scratch_database, spawn, wait_http, web_server
from jobqueue.core.db import open_pool

EVENTS = "/sa-core/v1/mission/events"
ENQUEUE_TO_RUNNING = """
SELECT q.job_id::text, extract(epoch FROM q.at) AS queued_at, extract(epoch FROM r.at) AS running_at
  FROM sa_job_event q
  JOIN sa_job_event r ON r.job_id = q.job_id AND r.from_state = 'queued' AND r.to_state = 'running'
 WHERE q.from_state IS NULL AND q.job_id = ANY(%s)
"""


WARMUP = 20
COMMIT_PROBE = "INSERT INTO sa_audit (org_id, action) VALUES (0, 'bench commit probe')"


class CommitWatcher:
    """A LISTEN connection of the bench's own: when each job-queued notification (sent at commit) arrived."""

    def __init__(self, url: str) -> None:
        self.heard: list[float] = []
        self._conn = psycopg.connect(url, autocommit=True)
        self._conn.execute("LISTEN sa_job_queued")
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        with contextlib.suppress(psycopg.Error):
            for _ in self._conn.notifies():
                self.heard.append(time.time())


def commit_cost(url: str, samples: int = 200) -> list[float]:
    """Round trips of a one-row INSERT that commits: the WAL flush every enqueue pays."""
    with psycopg.connect(url, autocommit=True) as conn:
        times = []
        for _ in range(samples):
            started = time.perf_counter()
            conn.execute(COMMIT_PROBE)
            times.append((time.perf_counter() - started) * 1000)
    return times


class Client:
    """One SSE connection on a raw socket; records (receipt - at) for every event it reads."""

    def __init__(self, port: int, token: str, track_states: bool = False) -> None:
        self.port = port
        self.token = token
        self.track_states = track_states
        self.latencies: list[float] = []
        self.states: dict[str, str] = {}
        self.changed = asyncio.Event()

    async def connect(self) -> None:
        self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._writer.write((f"GET {EVENTS} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            f"Authorization: Bearer {self.token}\r\nAccept: text/event-stream\r\n\r\n"
                            ).encode())
        await self._writer.drain()
        head = await self._reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise SystemExit(f"stream refused: {head!r}")

    async def follow(self) -> None:
        pending = b""
        while data := await self._reader.read(65536):
            received = time.time()
            lines = (pending + data).split(b"\n")
            pending = lines.pop()
            for line in lines:
                if not line.startswith(b"data: "):
                    continue
                # PERF: the client shares the machine with the server; read only `at` (no JSON).
                at = line.find(b'"at":"') + 6
                stamp = datetime.fromisoformat(line[at:line.index(b'"', at)].decode())
                self.latencies.append((received - stamp.timestamp()) * 1000)
                if self.track_states:
                    event = json.loads(line[6:])
                    self.states[event["job_id"]] = event["to_state"]
                self.changed.set()

    def close(self) -> None:
        self._writer.close()


def _stats(values: Sequence[float]) -> str:
    return (f"p50 {percentile(values, 50):7.2f} ms  p95 {percentile(values, 95):7.2f} ms  "
            f"p99 {percentile(values, 99):7.2f} ms  max {max(values):7.2f} ms  (n={len(values)})")


def _worker_rss_mib(master_pid: int) -> float:
    """Resident memory of gunicorn's (single) worker process, from /proc."""
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    total = 0
    for pid in children:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


async def _wait_until(client: Client, done: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        client.changed.clear()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SystemExit(f"{what}: not within {timeout}s")
        await asyncio.wait_for(client.changed.wait(), remaining)


async def enqueue_to_running(base: str, port: int, token: str, jobs: int) -> list[str]:
    """(a): sequential prompts, each POSTed once the worker is idle again; returns every job id,
    in order, the first WARMUP of them not to be measured."""
    watcher = Client(port, token, track_states=True)
    await watcher.connect()
    follow = asyncio.create_task(watcher.follow())
    job_ids: list[str] = []
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}) as http:
        for i in range(jobs + WARMUP):
            response = await http.post("/sa-core/v1/prompt", json={"text": f"idle worker {i}"})
            job_id = response.json()["job_id"]

            def succeeded(job_id: str = job_id) -> bool:
                return watcher.states.get(job_id) == "succeeded"

            await _wait_until(watcher, succeeded, f"job {job_id} succeeded", 10.0)
            # NOTE: lets the worker finish the claim round its freed slot triggers, so the next
            # prompt finds it idle, waiting for a notification.
            await asyncio.sleep(0.02)
            job_ids.append(job_id)
    watcher.close()
    follow.cancel()
    return job_ids


async def sse_delivery(base: str, port: int, token: str, clients: int, prompts: int,
                       master_pid: int) -> tuple[list[float], list[float], float]:
    """(b): `clients` streams of one user; returns event latencies, POST latencies, worker RSS."""
    streams = [Client(port, token) for _ in range(clients)]
    for start in range(0, clients, 50):
        await asyncio.gather(*(s.connect() for s in streams[start:start + 50]))
    tasks = [asyncio.create_task(s.follow()) for s in streams]
    rss = _worker_rss_mib(master_pid)
    posts: list[float] = []
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}) as http:
        for i in range(prompts):
            started = time.perf_counter()
            response = await http.post("/sa-core/v1/prompt", json={"text": f"fan out {i}"})
            posts.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 202, response.text
            await asyncio.sleep(0.05)
    expected = prompts * 3
    for stream in streams:

        def complete(stream: Client = stream) -> bool:
            return len(stream.latencies) >= expected

        await _wait_until(stream, complete, f"{expected} events on every stream", 30.0)
    for stream in streams:
        stream.close()
    for task in tasks:
        task.cancel()
    return [lat for s in streams for lat in s.latencies], posts, rss


async def run(args: argparse.Namespace, url: str, token: str, master_pid: int) -> None:
    base = f"http://127.0.0.1:{args.port}"
    commits = CommitWatcher(url)
    job_ids = await enqueue_to_running(base, args.port, token, args.jobs)
    order = {job_id: n for n, job_id in enumerate(job_ids)}
    pool = open_pool(url, name="bench", max_size=1)
    with pool.connection() as conn:
        rows = conn.execute(ENQUEUE_TO_RUNNING, (job_ids[WARMUP:],)).fetchall()
    pool.close()
    from_commit = [(float(r["running_at"]) - commits.heard[order[r["job_id"]]]) * 1000 for r in rows]
    from_insert = [(float(r["running_at"]) - float(r["queued_at"])) * 1000 for r in rows]
    print(f"(a) enqueue -> running, idle worker, {len(rows)} jobs one at a time "
          "(target p50 <= 2 ms, p99 <= 5 ms)")
    print(f"    from the enqueue's commit:     {_stats(from_commit)}")
    print(f"    from the queued row's stamp:   {_stats(from_insert)}")
    print(f"    (one commit on this server:    {_stats(commit_cost(url))})")
    print(f"(b) SSE delivery, {args.prompts} prompts at 20/s (3 events each) to N clients of one user "
          "on one gevent web process (target p99 < 200 ms at 500, aim 50 ms)")
    for clients in args.clients:
        latencies, posts, rss = await sse_delivery(base, args.port, token, clients, args.prompts,
                                                   master_pid)
        print(f"    {clients:4d} clients: {_stats(latencies)}")
        print(f"                  POST /prompt meanwhile: median {statistics.median(posts):.2f} ms  "
              f"p99 {percentile(posts, 99):.2f} ms; web worker RSS {rss:.0f} MiB with streams open")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200, help="(a) jobs measured")
    parser.add_argument("--prompts", type=int, default=100, help="(b) prompts per client count")
    parser.add_argument("--clients", type=lambda s: [int(n) for n in s.split(",")], default=[1, 100, 500])
    parser.add_argument("--port", type=int, default=8767)
    parser.add_argument("--provider-port", type=int, default=8768)
    args = parser.parse_args()
    with scratch_database() as url:
        token = bench_token(url)
        provider_url = f"http://127.0.0.1:{args.provider_port}"
        provider = spawn([str(VENV_BIN / "sa-core"), "fake-provider", "--port", str(args.provider_port)], {})
        # NOTE: every stream uses one token, and a round's closed streams are noticed only at
        # their next keepalive (so the caps allow every round's streams at once, and the stream
        # part (a) listens on): the fan-out is measured here, not the stream caps.
        streams = str(2 * sum(args.clients) + 10)
        env = {"DATABASE_URL": url, "WEB_CONCURRENCY": "1", "SA_PROVIDER_URL": provider_url,
               "SA_SSE_MAX_STREAMS_PER_TOKEN": streams, "SA_SSE_MAX_STREAMS": streams}
        worker = spawn([str(VENV_BIN / "sa-core"), "run-worker"], env)
        try:
            wait_http(f"{provider_url}/healthz")
            with web_server(env, args.port) as web:
                print(f"one gunicorn worker process ({os.environ.get('SA_WEB_WORKER_CLASS', 'gevent')}), "
                      "one `sa-core run-worker` (LISTEN wake-up), fake provider without latency")
                asyncio.run(run(args, url, token, web.pid))
        finally:
            for proc in (worker, provider):
                proc.terminate()
            for proc in (worker, provider):
                proc.wait(timeout=30)


if __name__ == "__main__":
    main()
