"""Streamed answers delivered to SSE viewers: chunk-to-viewer latency with N viewers, one job each.

Usage: .venv/bin/python -m bench.stream_viewers [--viewers 1000] [--latency 10] [--chunks 20]
       [--chunk-chars 0] [--streams-per-viewer 1] [--port 8777]

The Procfile's processes on a scratch database: one gunicorn (gevent) web process, one
`sa-core run-worker --concurrency N` whose only route streams (`"stream": true`), and
bench/slow_provider.py streaming every answer as `--chunks` chunks spread over `--latency`
seconds, each chunk's text the provider's `time.time()` when it wrote it (`<T>`).
N viewers, each a user of its own with a token of its own, open `GET /mission/events` on raw
asyncio sockets (no HTTP library between the socket and the clock), then each user POSTs one
prompt. Every `job.output_delta` a viewer reads is searched for the stamps it carries (a delta
coalesces the chunks written since the previous one), and so is the final event's
`response_text` for the chunks no delta brought; one sample per chunk is `receipt time - T`:
the provider's write, the worker's read and its write of the delta, the wake-up, the hub's read
and the fan-out, the socket. Same host, same clock.
Printed: p50/p95/p99/max of those samples, and p50/p99 of those written once every prompt was
in (delivery alone: during the burst of POSTs the one web process also serves them), how many
chunks reached their viewer and how many of them only with the final event, and the CPU
seconds the web and the worker processes spent over the run (from /proc), per job. Target
(issue 28): p99 under 250 ms at 1,000 viewers. `--chunk-chars N` pads each chunk (before its
stamp) for long answers, and `--streams-per-viewer K` opens K streams per user (issue 28's
other case: one 4.9 MB answer, four subscribers: `--viewers 1 --streams-per-viewer 4
--chunk-chars 245000`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path

import httpx

from bench.common import (
    VENV_BIN,
    format_table,
    percentile,
    scratch_database,
    spawn,
    start_slow_provider,
    web_server,
)
from bench.peers import machine_header
from jobqueue.core.db import open_pool
from jobqueue.core.tokens import create_token
from jobqueue.devtools.embedded_db import admin_conninfo

__all__ = ["main"]

EVENTS = "/sa-core/v1/mission/events"
STAMP = re.compile(rb"<(\d+\.\d+)>")
DELTA = b"event: job.output_delta"


class Viewer:
    """One user's SSE stream on a raw socket: the chunk latencies it saw and when its job ended."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token
        self.latencies: list[float] = []
        self.stamps: list[float] = []
        self.seen: set[bytes] = set()
        self.deltas = 0
        self.finals = 0
        self.done = asyncio.Event()

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
        kind = b""
        while data := await self._reader.read(65536):
            received = time.time()
            lines = (pending + data).split(b"\n")
            pending = lines.pop()
            for line in lines:
                if line.startswith(b"event: "):
                    kind = line
                elif line.startswith(b"data: "):
                    if kind == DELTA:
                        self.deltas += 1
                        # PERF: the viewers share the machine with the server; no JSON here.
                        self._saw(STAMP.findall(line), received)
                    elif b'"to_state":"succeeded"' in line:
                        # NOTE: the chunks no delta brought (the last one ends the job at once)
                        # reach the viewer in the final event's response_text.
                        self._saw(STAMP.findall(line), received, final=True)
                        self.done.set()
                    kind = b""

    def _saw(self, stamps: list[bytes], received: float, final: bool = False) -> None:
        for stamp in stamps:
            if stamp not in self.seen:
                self.seen.add(stamp)
                self.latencies.append((received - float(stamp)) * 1000)
                self.stamps.append(float(stamp))
                self.finals += final

    def close(self) -> None:
        self._writer.close()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _web_worker_pid(master_pid: int) -> int:
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    return int(children[0])


async def _post_all(base: str, tokens: list[str]) -> None:
    """One prompt per user, 20 requests at a time; a request whose connection broke is sent
    again with the same Idempotency-Key (gunicorn closes idle keep-alive connections after 2 s)."""
    gate = asyncio.Semaphore(20)
    limits = httpx.Limits(keepalive_expiry=1.0)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as http:

        async def post(n: int, token: str) -> None:
            headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": f"viewer-{n}"}
            async with gate:
                for attempt in range(3):
                    try:
                        response = await http.post("/sa-core/v1/prompt", headers=headers,
                                                   json={"text": f"viewer {n}"})
                        break
                    except httpx.TransportError:
                        if attempt == 2:
                            raise
                if response.status_code not in (200, 202):
                    raise SystemExit(f"POST /prompt answered {response.status_code}: {response.text}")

        await asyncio.gather(*(post(n, token) for n, token in enumerate(tokens)))


async def measure(args: argparse.Namespace, tokens: list[str], web_pid: int,
                  worker_pid: int) -> list[list[str]]:
    viewers = [Viewer(args.port, token) for token in tokens
               for _ in range(args.streams_per_viewer)]
    for start in range(0, len(viewers), 50):
        await asyncio.gather(*(v.connect() for v in viewers[start:start + 50]))
    tasks = [asyncio.create_task(v.follow()) for v in viewers]
    web_cpu, worker_cpu = _cpu_s(web_pid), _cpu_s(worker_pid)
    started = time.monotonic()
    await _post_all(f"http://127.0.0.1:{args.port}", tokens)
    posted = time.monotonic() - started
    posts_done = time.time()
    timeout = args.latency * 3 + 60
    try:
        await asyncio.wait_for(asyncio.gather(*(v.done.wait() for v in viewers)), timeout)
    except TimeoutError:
        ended = sum(v.done.is_set() for v in viewers)
        print(f"only {ended} of {len(viewers)} jobs were seen to succeed within {timeout:.0f}s",
              file=sys.stderr)
    elapsed = time.monotonic() - started
    web_cpu, worker_cpu = _cpu_s(web_pid) - web_cpu, _cpu_s(worker_pid) - worker_cpu
    for viewer in viewers:
        viewer.close()
    for task in tasks:
        task.cancel()
    samples = [lat for v in viewers for lat in v.latencies]
    # NOTE: the chunks written once every prompt was in: delivery alone, without the web
    # process also taking the burst of 1,000 POSTs.
    steady = [lat for v in viewers for lat, at in zip(v.latencies, v.stamps, strict=True)
              if at >= posts_done]
    jobs = len(tokens)
    if not samples:
        raise SystemExit("no chunk reached a viewer")
    return [["viewers", "chunks seen", "of sent", "by final", "deltas", "p50 ms", "p95 ms",
             "p99 ms", "max ms", "after POSTs: n", "p50 ms", "p99 ms", "web CPU s", "web ms/job",
             "worker CPU s", "worker ms/job", "wall s", "POSTs s"],
            [str(len(viewers)), f"{len(samples):,}",
             f"{len(samples) / (len(viewers) * args.chunks):.1%}",
             f"{sum(v.finals for v in viewers):,}", f"{sum(v.deltas for v in viewers):,}",
             f"{percentile(samples, 50):.1f}", f"{percentile(samples, 95):.1f}",
             f"{percentile(samples, 99):.1f}", f"{max(samples):.1f}", f"{len(steady):,}",
             f"{percentile(steady, 50):.1f}" if steady else "-",
             f"{percentile(steady, 99):.1f}" if steady else "-",
             f"{web_cpu:.1f}", f"{web_cpu * 1000 / jobs:.1f}", f"{worker_cpu:.1f}",
             f"{worker_cpu * 1000 / jobs:.1f}", f"{elapsed:.1f}", f"{posted:.1f}"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--viewers", type=int, default=1000, help="viewers, one user and one job each")
    parser.add_argument("--latency", type=float, default=10.0, help="seconds each answer takes")
    parser.add_argument("--chunks", type=int, default=20, help="chunks per streamed answer")
    parser.add_argument("--chunk-chars", type=int, default=0, help="padding per chunk")
    parser.add_argument("--streams-per-viewer", type=int, default=1,
                        help="SSE streams each user opens (at most 10, the per-token cap)")
    parser.add_argument("--port", type=int, default=8777)
    args = parser.parse_args()
    print("\n".join(machine_header(admin_conninfo("SA_BENCH_DATABASE_URL"))), flush=True)
    provider, provider_url = start_slow_provider(args.latency, args.chunks, args.chunk_chars)
    try:
        with scratch_database() as url:
            pool = open_pool(url, name="bench-tokens", max_size=1)
            try:
                tokens = [create_token(pool, 1, user) for user in range(1, args.viewers + 1)]
            finally:
                pool.close()
            streams = str(args.viewers * args.streams_per_viewer + 50)
            env = {"DATABASE_URL": url, "WEB_CONCURRENCY": "1", "SA_PROVIDER_URL": "",
                   "SA_PROVIDER_ROUTES": json.dumps({"routes": [
                       {"name": "streamed", "base_url": provider_url, "stream": True}]}),
                   "SA_SSE_MAX_STREAMS": streams,
                   "SA_WEB_CONNECTIONS": str(2 * args.viewers * args.streams_per_viewer + 200)}
            worker = spawn([str(VENV_BIN / "sa-core"), "run-worker", "--concurrency",
                            str(args.viewers)], env)
            try:
                with web_server(env, args.port) as web:
                    print(f"one gunicorn (gevent) web process, one `sa-core run-worker --concurrency "
                          f"{args.viewers}`, bench/slow_provider.py: {args.chunks} chunks over "
                          f"{args.latency:g} s per answer; SA_STREAM_INTERVAL "
                          f"{os.environ.get('SA_STREAM_INTERVAL', 'default')}\n", flush=True)
                    table = asyncio.run(measure(args, tokens, _web_worker_pid(web.pid), worker.pid))
            finally:
                worker.terminate()
                worker.wait(timeout=60)
    finally:
        provider.terminate()
        provider.wait(timeout=10)
    print(format_table(table))


if __name__ == "__main__":
    main()
