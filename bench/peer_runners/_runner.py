"""Shared driver of the peer runners: argument parsing, the two measurements, one result line.

Standard library only: each runner runs under its own library's virtual environment.

A runner is `python <runner>.py DATABASE_URL burndown N`, `... llm N` or `... pickup K`, with
`--concurrency C` (and `--provider-url URL` for llm). It prints its figures as one JSON line
prefixed with `PEER_RESULT ` (other output, such as library logs, may come before it).

- burndown: enqueue N jobs one at a time (each its own commit) with no worker running
  (enqueues/s), then start one worker and time from the first task start to the moment the
  database shows every job finished (jobs/s).
- llm: a burn-down whose task makes one chat-completion call to `--provider-url` (bench/llm_shaped.py
  serves one that answers after a fixed delay) with aiohttp, the asyncio client that holds
  thousands of calls (httpx.AsyncClient's pool spends milliseconds of CPU per call at these
  counts; docs/decisions.md). Also reports this process's
  CPU seconds from the worker's start to the end, and its peak RSS.
- pickup: with one idle worker running, enqueue one job at a time K times and measure
  enqueue commit (the enqueue call returned) -> task start, both with `time.time()` in this
  one process; a random 20-60 ms pause separates jobs so the worker is idle each time (and
  a poll loop is met at a random phase). Five warm-up jobs go first; sampling stops early
  after `--budget` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Adapter", "LlmCall", "Probe", "Result", "build_parser", "emit", "main", "measure_burndown",
           "measure_pickup", "run_on_uvloop"]

RESULT_PREFIX = "PEER_RESULT "
WARMUP_JOBS = 5
PICKUP_TIMEOUT = 30.0
DONE_POLL = 0.005


@dataclass
class Probe:
    """What the no-op task reports: when the first task started, how many ran, each job's start."""

    target: int = 0
    count: int = 0
    first_start: float | None = None
    all_started: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: dict[int, asyncio.Future[float]] = field(default_factory=dict)

    def hit(self, seq: int) -> None:
        """Called at the very start of the no-op task with the job's sequence number."""
        now = time.time()
        if self.first_start is None:
            self.first_start = now
        self.count += 1
        waiter = self.waiters.pop(seq, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(now)
        if self.target and self.count >= self.target:
            self.all_started.set()


class Adapter(Protocol):
    """One library under test, wired to a Probe."""

    name: str
    version: str

    async def setup(self) -> None:
        """Connects and installs the library's schema in the (empty) database."""

    async def enqueue(self, seq: int) -> None:
        """Enqueues one no-op job carrying `seq`, committed when this returns."""

    async def start_worker(self) -> None:
        """Starts one worker at the chosen concurrency, in this process."""

    async def stop_worker(self) -> None:
        """Stops the worker."""

    async def unfinished(self) -> int:
        """Jobs not yet finished, as the database shows them."""

    async def close(self) -> None:
        """Releases connections."""


Result = dict[str, Any]

# NOTE: the same request body sa-core's worker sends for a one-message prompt.
LLM_BODY = json.dumps({"model": "bench-model",
                       "messages": [{"role": "user", "content": "bench prompt"}]}).encode()


class LlmCall:
    """The llm task's HTTP call: one aiohttp session for the process, as many connections as
    jobs run at once; a no-op when no provider URL was given (burndown)."""

    def __init__(self, url: str | None, concurrency: int) -> None:
        self.url = None if url is None else url.rstrip("/") + "/chat/completions"
        self.concurrency = concurrency
        self.session: Any = None

    async def __call__(self) -> None:
        if self.url is None:
            return
        if self.session is None:
            import aiohttp  # type: ignore[import-not-found]

            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.concurrency),
                timeout=aiohttp.ClientTimeout(total=180))
        async with self.session.post(self.url, data=LLM_BODY,
                                     headers={"Content-Type": "application/json",
                                              "Authorization": "Bearer bench"}) as response:
            response.raise_for_status()
            body = await response.json()
        if not isinstance(body["choices"][0]["message"]["content"], str):
            raise ValueError("no completion text")

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure_burndown(adapter: Adapter, probe: Probe, jobs: int, timeout: float) -> Result:
    """Enqueues `jobs` one at a time, then burns them down with one worker."""
    started = time.perf_counter()
    for seq in range(jobs):
        await adapter.enqueue(seq)
    enqueue_s = time.perf_counter() - started
    probe.target = jobs
    cpu_started = _cpu_seconds()
    await adapter.start_worker()
    try:
        await asyncio.wait_for(probe.all_started.wait(), timeout)
        deadline = time.monotonic() + timeout
        while await adapter.unfinished() > 0:
            if time.monotonic() > deadline:
                raise TimeoutError("jobs started but not all finished in time")
            await asyncio.sleep(DONE_POLL)
        finished = time.time()
    finally:
        await adapter.stop_worker()
    assert probe.first_start is not None
    burndown_s = finished - probe.first_start
    return {"jobs": jobs, "enqueue_s": enqueue_s, "enqueue_per_s": jobs / enqueue_s,
            "burndown_s": burndown_s, "jobs_per_s": jobs / burndown_s,
            "worker_cpu_s": _cpu_seconds() - cpu_started,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


async def measure_pickup(adapter: Adapter, probe: Probe, pickups: int, budget: float) -> Result:
    """Idle worker; one job at a time; enqueue return -> task start, in milliseconds.

    Stops early, with fewer samples, once `budget` seconds have gone by.
    """
    loop = asyncio.get_running_loop()
    await adapter.start_worker()
    latencies: list[float] = []
    deadline = time.monotonic() + budget
    try:
        for seq in range(-WARMUP_JOBS, pickups):
            if seq >= 0 and time.monotonic() > deadline:
                break
            waiter: asyncio.Future[float] = loop.create_future()
            probe.waiters[seq] = waiter
            await adapter.enqueue(seq)
            committed = time.time()
            task_started = await asyncio.wait_for(waiter, PICKUP_TIMEOUT)
            if seq >= 0:
                latencies.append((task_started - committed) * 1000)
            await asyncio.sleep(random.uniform(0.02, 0.06))
    finally:
        await adapter.stop_worker()
    return {"pickups": pickups, "pickup_ms": latencies}


def build_parser() -> argparse.ArgumentParser:
    """The arguments every runner takes."""
    parser = argparse.ArgumentParser()
    parser.add_argument("database_url")
    # NOTE: `post` (seconds of POST /prompt) is sa-core's runner's alone.
    parser.add_argument("mode", choices=["burndown", "llm", "pickup", "post"])
    parser.add_argument("count", type=int)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--budget", type=float, default=60.0,
                        help="pickup: stop taking samples after this many seconds")
    parser.add_argument("--provider-url", default=None,
                        help="llm: the OpenAI-compatible base URL each task calls")
    return parser


def emit(result: Result) -> None:
    """Prints the one result line on the process's real stdout (even if sys.stdout was swapped)."""
    out = sys.__stdout__ or sys.stdout
    out.write(RESULT_PREFIX + json.dumps(result) + "\n")
    out.flush()


def run_on_uvloop(coro: Coroutine[Any, Any, None]) -> None:
    """Runs `coro` on uvloop when the runner's environment has it (as its library recommends),
    else on asyncio's own loop."""
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def main(
    build: Callable[[argparse.Namespace, Probe], Adapter],
    run: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run,
) -> None:
    """Parses arguments, runs the chosen measurement on the event loop `run` starts, prints it."""
    args = build_parser().parse_args()

    async def body() -> None:
        probe = Probe()
        adapter = build(args, probe)
        await adapter.setup()
        try:
            measure: Awaitable[Result]
            if args.mode in ("burndown", "llm"):
                measure = measure_burndown(adapter, probe, args.count, args.timeout)
            else:
                measure = measure_pickup(adapter, probe, args.count, args.budget)
            result = await measure
        finally:
            await adapter.close()
        emit({"ok": True, "library": adapter.name, "version": adapter.version,
              "python": sys.version.split()[0], "mode": args.mode,
              "concurrency": args.concurrency, **result})

    run(body())
